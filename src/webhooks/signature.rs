//! Webhook signature schemes. Both are HMAC-SHA256 over the raw body plus a timestamp,
//! checked before any parsing, with constant-time comparison (`Mac::verify_slice`), and
//! with a timestamp tolerance both ways so a captured request cannot be replayed later.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

use crate::settings::WebhookScheme;

/// Why a signature was refused. Each maps to its own 401 `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// A required signature header is absent.
    Missing,
    /// Present but malformed, or no signature matches any configured secret.
    Invalid,
    /// Signed too long ago or too far in the future.
    OutOfTolerance,
}

/// Header values a scheme reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct SignatureHeaders<'a> {
    pub stripe_signature: Option<&'a str>,
    pub webhook_id: Option<&'a str>,
    pub webhook_timestamp: Option<&'a str>,
    pub webhook_signature: Option<&'a str>,
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac
}

fn within(timestamp: i64, now: i64, tolerance_secs: u64) -> Result<(), SignatureError> {
    if now.abs_diff(timestamp) <= tolerance_secs {
        Ok(())
    } else {
        Err(SignatureError::OutOfTolerance)
    }
}

/// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`, HMAC of `"{t}.{body}"` keyed
/// with the whole secret string. Only `v1` counts; `v0` and unknown schemes are ignored.
pub fn verify_stripe(
    headers: &SignatureHeaders<'_>,
    body: &[u8],
    secrets: &[SecretString],
    tolerance_secs: u64,
    now: i64,
) -> Result<(), SignatureError> {
    let header = headers.stripe_signature.ok_or(SignatureError::Missing)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for item in header.split(',') {
        match item.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => signatures.extend(hex::decode(value).ok()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Invalid)?;
    if signatures.is_empty() {
        return Err(SignatureError::Invalid);
    }
    within(timestamp, now, tolerance_secs)?;
    let signed_timestamp = timestamp.to_string();
    let keys = secrets
        .iter()
        .map(|s| s.expose_secret().as_bytes().to_vec());
    any_signature_matches(
        keys,
        &[signed_timestamp.as_bytes(), b".", body],
        &signatures,
    )
}

/// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature` (space-separated
/// `v1,<base64>`), HMAC of `"{id}.{timestamp}.{body}"` keyed with the base64 after `whsec_`.
pub fn verify_standard(
    headers: &SignatureHeaders<'_>,
    body: &[u8],
    secrets: &[SecretString],
    tolerance_secs: u64,
    now: i64,
) -> Result<(), SignatureError> {
    let id = headers.webhook_id.ok_or(SignatureError::Missing)?;
    let timestamp_text = headers.webhook_timestamp.ok_or(SignatureError::Missing)?;
    let header = headers.webhook_signature.ok_or(SignatureError::Missing)?;
    let timestamp = timestamp_text
        .parse::<i64>()
        .map_err(|_| SignatureError::Invalid)?;
    within(timestamp, now, tolerance_secs)?;
    let signatures: Vec<Vec<u8>> = header
        .split_whitespace()
        .filter_map(|item| item.strip_prefix("v1,"))
        .filter_map(|sig| BASE64.decode(sig).ok())
        .collect();
    if signatures.is_empty() {
        return Err(SignatureError::Invalid);
    }
    // Every configured secret decodes (`check_secret` ran at startup); one that does not
    // could not match anything anyway.
    let keys = secrets
        .iter()
        .filter_map(|s| standard_key(s.expose_secret()));
    any_signature_matches(
        keys,
        &[id.as_bytes(), b".", timestamp_text.as_bytes(), b".", body],
        &signatures,
    )
}

/// Whether any presented signature is the HMAC of `parts` under any of `keys` (several
/// during a secret rotation). Each comparison is constant-time (`verify_slice`).
fn any_signature_matches(
    keys: impl Iterator<Item = Vec<u8>>,
    parts: &[&[u8]],
    signatures: &[Vec<u8>],
) -> Result<(), SignatureError> {
    for key in keys {
        let expected = mac(&key, parts);
        if signatures
            .iter()
            .any(|candidate| expected.clone().verify_slice(candidate).is_ok())
        {
            return Ok(());
        }
    }
    Err(SignatureError::Invalid)
}

/// The HMAC key of a `whsec_<base64>` secret: `None` without the prefix or when the rest
/// is not base64. Configured secrets are checked with [`check_secret`] at startup, so
/// every one of them decodes here.
pub fn standard_key(secret: &str) -> Option<Vec<u8>> {
    BASE64.decode(secret.strip_prefix("whsec_")?).ok()
}

/// The smallest and largest Standard Webhooks key, in bytes (the specification's range).
pub const STANDARD_KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// The fewest characters a Stripe secret has after `whsec_`.
pub const STRIPE_SECRET_MIN_CHARS: usize = 16;

/// Whether `secret` is usable with `scheme`; the `Err` says what is wrong without
/// quoting the secret. `Settings::validate` runs it on every configured secret, so a
/// secret that could never verify anything stops the start instead of being ignored.
pub fn check_secret(scheme: WebhookScheme, secret: &str) -> Result<(), &'static str> {
    match scheme {
        WebhookScheme::StandardWebhooks => match standard_key(secret) {
            Some(key) if STANDARD_KEY_BYTES.contains(&key.len()) => Ok(()),
            Some(_) => Err("must be `whsec_` followed by the base64 of a 24 to 64 byte key"),
            None => Err("must be `whsec_` followed by standard base64 (with padding)"),
        },
        WebhookScheme::Stripe => match secret.strip_prefix("whsec_") {
            Some(rest)
                if rest.len() >= STRIPE_SECRET_MIN_CHARS
                    && rest.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                Ok(())
            }
            _ => Err(
                "must be `whsec_` followed by at least 16 visible ASCII characters, without spaces",
            ),
        },
    }
}

/// Signs like Stripe does; for tests and for the README's curl example.
pub fn sign_stripe(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(
        secret.as_bytes(),
        &[timestamp.to_string().as_bytes(), b".", body],
    )
    .finalize()
    .into_bytes();
    format!("t={timestamp},v1={}", hex::encode(tag))
}

/// Signs like a Standard Webhooks sender; for tests.
pub fn sign_standard(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = standard_key(secret).unwrap_or_default();
    let tag = mac(
        &key,
        &[
            id.as_bytes(),
            b".",
            timestamp.to_string().as_bytes(),
            b".",
            body,
        ],
    )
    .finalize()
    .into_bytes();
    format!("v1,{}", BASE64.encode(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_780_000_000;

    fn secrets(values: &[&str]) -> Vec<SecretString> {
        values
            .iter()
            .map(|v| SecretString::from(v.to_string()))
            .collect()
    }

    fn stripe(header: &str, body: &[u8], keys: &[&str]) -> Result<(), SignatureError> {
        let headers = SignatureHeaders {
            stripe_signature: Some(header),
            ..Default::default()
        };
        verify_stripe(&headers, body, &secrets(keys), 300, NOW)
    }

    #[test]
    fn stripe_accepts_any_matching_v1_and_rotated_secrets() {
        let body = br#"{"id":"evt_1"}"#;
        let good = sign_stripe("whsec_new", NOW, body);
        assert_eq!(stripe(&good, body, &["whsec_new"]), Ok(()));
        assert_eq!(stripe(&good, body, &["whsec_old", "whsec_new"]), Ok(()));
        let v1 = good.split(",v1=").nth(1).unwrap();
        let several = format!("t={NOW},v1={},v1={v1}", "00".repeat(32));
        assert_eq!(stripe(&several, body, &["whsec_new"]), Ok(()));
    }

    #[test]
    fn stripe_refusals() {
        let body = br#"{"id":"evt_1"}"#;
        let good = sign_stripe("whsec_a", NOW, body);
        assert_eq!(
            stripe(&good, b"{}", &["whsec_a"]),
            Err(SignatureError::Invalid),
            "body changed"
        );
        assert_eq!(
            stripe(&good, body, &["whsec_b"]),
            Err(SignatureError::Invalid),
            "other secret"
        );
        let v0_only = good.replace("v1=", "v0=");
        assert_eq!(
            stripe(&v0_only, body, &["whsec_a"]),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            stripe("garbage", body, &["whsec_a"]),
            Err(SignatureError::Invalid)
        );
        let old = sign_stripe("whsec_a", NOW - 301, body);
        assert_eq!(
            stripe(&old, body, &["whsec_a"]),
            Err(SignatureError::OutOfTolerance)
        );
        let future = sign_stripe("whsec_a", NOW + 301, body);
        assert_eq!(
            stripe(&future, body, &["whsec_a"]),
            Err(SignatureError::OutOfTolerance)
        );
        let headers = SignatureHeaders::default();
        assert_eq!(
            verify_stripe(&headers, body, &secrets(&["whsec_a"]), 300, NOW),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn secrets_are_checked_per_scheme_without_quoting_them() {
        use WebhookScheme::{StandardWebhooks, Stripe};
        let standard = |bytes: usize| format!("whsec_{}", BASE64.encode(vec![7u8; bytes]));
        assert_eq!(
            check_secret(StandardWebhooks, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Ok(())
        );
        assert_eq!(check_secret(StandardWebhooks, &standard(24)), Ok(()));
        assert_eq!(check_secret(StandardWebhooks, &standard(64)), Ok(()));
        let refused = [
            standard(23),
            standard(65),
            standard(32).replace("whsec_", ""),
            "whsec_not base64!".to_owned(),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS".to_owned(),
            String::new(),
        ];
        for secret in &refused {
            let problem = check_secret(StandardWebhooks, secret).unwrap_err();
            assert!(secret.is_empty() || !problem.contains(secret.as_str()));
        }

        let sixteen = "whsec_0123456789abcdef";
        assert_eq!(check_secret(Stripe, sixteen), Ok(()));
        for secret in [
            "whsec_0123456789abcde",
            "0123456789abcdef0123",
            "whsec_0123456789abcdef\n",
            "whsec_0123456789 abcdef",
            "",
        ] {
            assert!(check_secret(Stripe, secret).is_err(), "{secret:?}");
        }
    }

    #[test]
    fn standard_webhooks_round_trip_and_refusals() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"type":"payment.succeeded"}"#;
        let signature = sign_standard(secret, "msg_1", NOW, body);
        let ts = NOW.to_string();
        let headers = SignatureHeaders {
            webhook_id: Some("msg_1"),
            webhook_timestamp: Some(&ts),
            webhook_signature: Some(&signature),
            ..Default::default()
        };
        assert_eq!(
            verify_standard(&headers, body, &secrets(&[secret]), 300, NOW),
            Ok(())
        );
        let both = format!("v1,AAAA {signature}");
        let rotated = SignatureHeaders {
            webhook_signature: Some(&both),
            ..headers
        };
        assert_eq!(
            verify_standard(&rotated, body, &secrets(&["whsec_AAAA", secret]), 300, NOW),
            Ok(())
        );
        assert_eq!(
            verify_standard(&headers, b"{}", &secrets(&[secret]), 300, NOW),
            Err(SignatureError::Invalid)
        );
        let other_id = SignatureHeaders {
            webhook_id: Some("msg_2"),
            ..headers
        };
        assert_eq!(
            verify_standard(&other_id, body, &secrets(&[secret]), 300, NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify_standard(&headers, body, &secrets(&[secret]), 300, NOW + 301),
            Err(SignatureError::OutOfTolerance)
        );
        assert_eq!(
            verify_standard(&headers, body, &secrets(&[secret]), 300, NOW - 301),
            Err(SignatureError::OutOfTolerance)
        );
        let missing = SignatureHeaders {
            webhook_id: None,
            ..headers
        };
        assert_eq!(
            verify_standard(&missing, body, &secrets(&[secret]), 300, NOW),
            Err(SignatureError::Missing)
        );
    }
}
