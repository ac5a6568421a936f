//! The `If-Match` precondition of a token's state change (RFC 9110 §13.1.1), compared
//! strongly: a weak tag never matches.

use axum::http::{HeaderMap, header};

use crate::http::error::ApiError;

/// What openapi.yaml documents for `If-Match`, and exactly what [`if_match`] accepts: `*`,
/// or a comma-separated list of token versions, each quoted (`"3"`), weak (`W/"3"`) or
/// bare (`3`), 1–18 digits (which always fit an i64). The OpenAPI document takes it from
/// here (`http::openapi`, by the parameter's name); unit tests check it is the parser's.
pub(crate) const IF_MATCH_PATTERN: &str = r#"^[ \t]*(\*|(W/)?("[0-9]{1,18}"|[0-9]{1,18})([ \t]*,[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18}))*)[ \t]*$"#;

/// An `If-Match` precondition (RFC 9110 §13.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum IfMatch {
    /// `*`: any current version of an existing token.
    Any,
    /// One or more entity tags; the condition holds if any of them matches.
    Tags(Vec<EntityTag>),
}

/// One entity tag naming a token version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EntityTag {
    weak: bool,
    version: i64,
}

impl IfMatch {
    /// RFC 9110's strong comparison (§8.8.3.2), which `If-Match` requires: a weak tag
    /// never matches, a strong one matches only its own version.
    pub(super) fn matches(&self, version: i64) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => tags.iter().any(|t| !t.weak && t.version == version),
        }
    }

    /// Whether the strong tags, one at least, all name versions older than `version`
    /// (`*` names none): a precondition a retry of a change since made would carry. A
    /// weak tag never matched, so it made no first attempt; a tag the token as read has
    /// not reached yet is a read that is behind, not a retry.
    pub(super) fn names_only_older_than(&self, version: i64) -> bool {
        let mut strong = self.tags().iter().filter(|tag| !tag.weak).peekable();
        strong.peek().is_some() && strong.all(|tag| tag.version < version)
    }

    /// Whether a strong tag names a version the token as read has not reached: the
    /// client saw a later one (a new primary may not show it yet), so the same request
    /// may pass later.
    pub(super) fn names_a_version_above(&self, version: i64) -> bool {
        self.tags()
            .iter()
            .any(|tag| !tag.weak && tag.version > version)
    }

    /// The version a write can gate on without reading the token first: that of a lone
    /// strong tag. `*`, lists and weak tags are evaluated against the token as read.
    pub(super) fn sole_version(&self) -> Option<i64> {
        match self.tags() {
            [tag] if !tag.weak => Some(tag.version),
            _ => None,
        }
    }

    fn tags(&self) -> &[EntityTag] {
        match self {
            Self::Any => &[],
            Self::Tags(tags) => tags,
        }
    }
}

/// The `If-Match` precondition, from every `If-Match` field line (a recipient combines
/// them as one list, RFC 9110 §5.3). Absent → `None`; anything `IF_MATCH_PATTERN`
/// refuses → 422.
pub(super) fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let mut lines = headers.get_all(header::IF_MATCH).iter().peekable();
    if lines.peek().is_none() {
        return Ok(None);
    }
    let invalid = || {
        ApiError::validation(
            "If-Match",
            "must be `*` or token versions as given in their ETag, e.g. \"3\"",
        )
    };
    let mut text = String::new();
    for line in lines {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(line.to_str().map_err(|_| invalid())?);
    }
    let text = text.trim_matches([' ', '\t']);
    if text == "*" {
        return Ok(Some(IfMatch::Any));
    }
    text.split(',')
        .map(|element| entity_tag(element.trim_matches([' ', '\t'])))
        .collect::<Option<Vec<_>>>()
        .map(|tags| Some(IfMatch::Tags(tags)))
        .ok_or_else(invalid)
}

/// `"3"`, `W/"3"` or `3`: no sign, space or stray quote slips through.
fn entity_tag(element: &str) -> Option<EntityTag> {
    let (weak, tag) = match element.strip_prefix("W/") {
        Some(tag) => (true, tag),
        None => (false, element),
    };
    let digits = tag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(tag);
    Some(digits)
        .filter(|d| (1..=18).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<i64>().ok())
        .map(|version| EntityTag { weak, version })
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn parsed(value: &str) -> Result<Option<IfMatch>, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_MATCH, HeaderValue::from_str(value).unwrap());
        if_match(&headers)
    }

    fn strong(version: i64) -> EntityTag {
        EntityTag {
            weak: false,
            version,
        }
    }

    fn weak(version: i64) -> EntityTag {
        EntityTag {
            weak: true,
            version,
        }
    }

    #[test]
    fn only_tags_all_older_than_the_token_can_be_a_retry() {
        let condition = |value: &str| parsed(value).unwrap().unwrap();
        let older = |value: &str, version| condition(value).names_only_older_than(version);
        assert!(older("\"0\"", 1));
        assert!(older("\"0\", W/\"1\"", 2));
        assert!(
            older("\"0\", W/\"9\"", 2),
            "a weak tag never matched: not counted"
        );
        assert!(!older("\"1\"", 1), "the token's own version");
        assert!(!older("\"0\", \"5\"", 1), "a tag the token has not reached");
        assert!(
            !older("W/\"0\"", 1),
            "weak alone: no first attempt matched it"
        );
        assert!(!older("*", 1), "`*` names no version");
        let above = |value: &str, version| condition(value).names_a_version_above(version);
        assert!(above("\"0\", \"5\"", 1));
        assert!(!above("\"0\", W/\"5\"", 1), "a weak tag never matches");
        assert!(!above("*", 1));
    }

    fn tags(value: &str) -> Vec<EntityTag> {
        match parsed(value) {
            Ok(Some(IfMatch::Tags(tags))) => tags,
            other => panic!("{value:?}: {other:?}"),
        }
    }

    #[test]
    fn if_match_accepts_exactly_the_documented_forms() {
        assert!(matches!(if_match(&HeaderMap::new()), Ok(None)));
        for (value, tag) in [
            ("\"3\"", strong(3)),
            ("W/\"3\"", weak(3)),
            ("3", strong(3)),
            ("W/0", weak(0)),
            (" \"7\"\t", strong(7)),
        ] {
            assert_eq!(tags(value), [tag], "{value}");
        }
        assert_eq!(tags(&"9".repeat(18)), [strong(999_999_999_999_999_999)]);
        assert_eq!(parsed("*").unwrap(), Some(IfMatch::Any));
        assert_eq!(parsed(" * ").unwrap(), Some(IfMatch::Any));
        assert_eq!(
            tags("\"1\", W/\"2\",3 ,\t\"4\""),
            [strong(1), weak(2), strong(3), strong(4)]
        );
        // Found by scripts/fuzz-api.sh: the old parser took `+3`, `""3""` or `W/W/3`,
        // which openapi.yaml's pattern refuses.
        for bad in [
            "",
            " ",
            "\"\"",
            "\"",
            "+3",
            "-1",
            "\"3",
            "\"\"3\"\"",
            "W/W/3",
            "w/\"3\"",
            "3 4",
            "null",
            "**",
            "*, \"1\"",
            "\"1\",",
            ",\"1\"",
            "\"1\",,\"2\"",
            "\"abc\"",
            &"9".repeat(19),
        ] {
            assert!(
                matches!(parsed(bad), Err(ApiError::Validation(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn several_if_match_lines_are_one_list() {
        let mut headers = HeaderMap::new();
        headers.append(header::IF_MATCH, HeaderValue::from_static("\"1\""));
        headers.append(header::IF_MATCH, HeaderValue::from_static("W/\"2\", \"3\""));
        assert_eq!(
            if_match(&headers).unwrap(),
            Some(IfMatch::Tags(vec![strong(1), weak(2), strong(3)]))
        );
        headers.append(header::IF_MATCH, HeaderValue::from_static("*"));
        assert!(if_match(&headers).is_err(), "`*` is alone or not at all");
    }

    #[test]
    fn if_match_compares_strongly() {
        let any = IfMatch::Any;
        assert!(any.matches(0) && any.matches(41));
        assert_eq!(any.sole_version(), None);

        let one = IfMatch::Tags(vec![strong(3)]);
        assert!(one.matches(3) && !one.matches(2));
        assert_eq!(one.sole_version(), Some(3));

        let weak_only = IfMatch::Tags(vec![weak(3)]);
        assert!(!weak_only.matches(3), "a weak tag never matches");
        assert_eq!(weak_only.sole_version(), None);

        let list = IfMatch::Tags(vec![strong(1), weak(2), strong(3)]);
        assert!(list.matches(1) && list.matches(3));
        assert!(!list.matches(2) && !list.matches(4));
        assert_eq!(list.sole_version(), None);
    }

    #[test]
    fn the_documented_pattern_is_the_parsers() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
        for operation in ["redeem", "revoke", "transfer"] {
            let parameters =
                &doc["paths"][format!("/v1/tokens/{{tokenId}}/{operation}")]["post"]["parameters"];
            let if_match = parameters
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "If-Match")
                .unwrap();
            assert_eq!(
                if_match["schema"]["pattern"], IF_MATCH_PATTERN,
                "{operation}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::parsed;
        use crate::http::tokens::if_match::IF_MATCH_PATTERN;

        fn element() -> impl Strategy<Value = String> {
            prop_oneof![
                "(W/)?\"[0-9]{1,19}\"",
                "(W/)?[0-9]{1,19}",
                r#"[W/" *,0-9a-z+-]{0,6}"#,
            ]
        }

        proptest! {
            /// The parser accepts exactly what openapi.yaml's pattern accepts.
            #[test]
            fn parser_and_pattern_agree(
                elements in prop::collection::vec(element(), 1..4),
                separators in prop::collection::vec("[ \t]{0,2},[ \t]{0,2}|,|[ \t]", 3),
                edges in ("[ \t]{0,2}", "[ \t]{0,2}"),
            ) {
                let mut value = edges.0.clone();
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        value.push_str(&separators[i - 1]);
                    }
                    value.push_str(element);
                }
                value.push_str(&edges.1);
                let pattern = regex::Regex::new(IF_MATCH_PATTERN).unwrap();
                prop_assert_eq!(parsed(&value).is_ok(), pattern.is_match(&value), "{:?}", value);
            }
        }
    }
}
