//! The `Prefer` request header (RFC 7240): which preferences a request states, as far as
//! tokenmint understands them — `wait=N`, on `POST /v1/issuances`. What a preference
//! changes is the handler's and the issuer's business; this only reads it.

use axum::http::{HeaderMap, HeaderName};

/// `Prefer` (RFC 7240): how the client would like the request handled.
pub(super) const PREFER: HeaderName = HeaderName::from_static("prefer");
/// `Preference-Applied` (RFC 7240): which preference shaped the answer.
pub(super) const PREFERENCE_APPLIED: &str = "preference-applied";

/// The `wait` preference of the request's `Prefer` headers, in seconds (RFC 7240): the
/// first `wait` counts, its value a number of seconds, possibly quoted; one too large
/// for a `u64` is as long as can be (the issuer bounds it anyway). A malformed one, like
/// any preference not understood, is ignored.
pub(super) fn preferred_wait(headers: &HeaderMap) -> Option<u64> {
    let first_wait = headers
        .get_all(PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        // Parameters of a preference (after `;`) say nothing about waiting.
        .filter_map(|preference| preference.split(';').next())
        .map(|preference| match preference.split_once('=') {
            Some((name, value)) => (name.trim(), Some(value.trim())),
            None => (preference.trim(), None),
        })
        .find(|(name, _)| name.eq_ignore_ascii_case("wait"))?;
    let value = first_wait.1?;
    let digits = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn wait_of(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("prefer", HeaderValue::from_str(value).unwrap());
        }
        preferred_wait(&headers)
    }

    #[test]
    fn the_wait_preference_is_read_as_rfc_7240_writes_it() {
        assert_eq!(wait_of(&["wait=10"]), Some(10));
        assert_eq!(wait_of(&["WAIT = 7"]), Some(7));
        assert_eq!(wait_of(&["wait=\"5\""]), Some(5));
        assert_eq!(wait_of(&["respond-async, wait=3"]), Some(3));
        assert_eq!(wait_of(&["handling=lenient", "wait=4;foo=bar"]), Some(4));
        // Only the first occurrence counts.
        assert_eq!(wait_of(&["wait=2, wait=9"]), Some(2));
        // Too large for a u64: as long as can be, clamped by the issuer.
        assert_eq!(wait_of(&["wait=99999999999999999999999"]), Some(u64::MAX));
    }

    #[test]
    fn malformed_or_other_preferences_are_ignored() {
        for values in [
            &[][..],
            &["respond-async"],
            &["wait"],
            &["wait="],
            &["wait=-1"],
            &["wait=1.5"],
            &["wait=ten"],
            &["waiting=3"],
            &["wait=\"\""],
        ] {
            assert_eq!(wait_of(values), None, "{values:?}");
        }
    }
}
