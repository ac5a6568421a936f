//! Request-body extraction with tokenmint's error contract: wrong content type → 415,
//! too large → 413, not JSON → 400, wrong shape or unknown field → 422 naming the field.
//! axum's own `Json` answers these in plain text; clients get problem+json instead.
//!
//! Unknown fields do not end the checks: each is recorded and the body parsed without it,
//! and the extractors hand the recorded errors to the handler, whose own field checks add
//! to them, so one 422 names every bad field.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

use super::error::{ApiError, MAX_LISTED_ERRORS};
use crate::domain::FieldErrors;

/// A JSON request body of type `T` (which should `deny_unknown_fields`), and the errors
/// already found in it (its unknown fields): the handler adds its own checks' errors and
/// answers all of them together (`FieldErrors::finish`).
pub struct JsonBody<T>(pub T, pub FieldErrors);

/// Like `JsonBody`, but an empty body (or a JSON `null`) means `T::default()` (e.g. redeem's
/// optional body).
pub struct OptionalJsonBody<T>(pub T, pub FieldErrors);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        require_json_content_type(&req)?;
        let bytes = read_body(req, state).await?;
        parse_json(&bytes).map(|(body, errors)| JsonBody(body, errors))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let has_content_type = req.headers().contains_key(header::CONTENT_TYPE);
        if has_content_type {
            require_json_content_type(&req)?;
        }
        let bytes = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(T::default(), FieldErrors::default()));
        }
        if !has_content_type {
            return Err(ApiError::UnsupportedMediaType);
        }
        if bytes.trim_ascii() == b"null" {
            return Ok(OptionalJsonBody(T::default(), FieldErrors::default()));
        }
        parse_json(&bytes).map(|(body, errors)| OptionalJsonBody(body, errors))
    }
}

fn require_json_content_type(req: &Request) -> Result<(), ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType)
    }
}

/// The body's bytes, within `server.body_limit_bytes` (413 past it).
pub(super) async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|rejection: BytesRejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::MalformedJson("the body could not be read".to_owned())
            }
        })
}

/// A query string's parameters, in order and as sent. A query that cannot be read as
/// one (bad percent-encoding, say) is a 422 naming `query`. Handlers take it as a
/// `Result` and answer its error after their scope check, so a key without the scope
/// hears 403 whatever it sent.
pub struct QueryParameters(Vec<(String, String)>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for QueryParameters {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(pairs)| Self(pairs))
            .map_err(|_| ApiError::validation("query", "is not a valid query string"))
    }
}

impl QueryParameters {
    /// Hands each parameter to `parse`, in order, once: a repeated one is an error in
    /// `errors`, and so is one `parse` does not know (it answers `false`). A list filters
    /// by parameter, so a second value for one would be silently ignored or silently win;
    /// either way the client would not get what it asked for.
    pub fn parse(
        &self,
        errors: &mut FieldErrors,
        mut parse: impl FnMut(&str, &str, &mut FieldErrors) -> bool,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in &self.0 {
            if seen.contains(&name.as_str()) {
                errors.push(name, "must be given at most once");
                continue;
            }
            seen.push(name);
            if !parse(name, value, errors) {
                errors.push(name, "is not a known query parameter");
            }
        }
    }
}

/// Parses `bytes` as a JSON object into `T`, mapping every failure to the contract. `Ok`
/// carries the unknown fields found (as errors for the caller to report with its own);
/// a body that still does not fit `T` without them is a 422 naming them and the misfit.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, FieldErrors), ApiError> {
    let mut value = read_value(bytes)?;
    if !value.is_object() {
        return Err(ApiError::validation("body", "must be a JSON object"));
    }
    let mut errors = FieldErrors::default();
    // serde stops at the first unknown field: record it, take it out and parse again, so
    // that the other fields are still judged. Every round removes a key, so this ends;
    // each round reads the whole body again, so the rounds stop one past what a problem
    // lists (a body of thousands of made-up keys would otherwise cost their square), and
    // the count of invalid fields is then at least what it says.
    let mut unknown = 0;
    loop {
        let err = match serde_path_to_error::deserialize(&value) {
            Ok(body) => return Ok((body, errors)),
            Err(err) => err,
        };
        let message = err.inner().to_string();
        if message.starts_with("unknown field")
            && let Some(name) = quoted_name(&message)
            && let Some(field) = remove_unknown(&mut value, err.path(), &name)
        {
            errors.push(&field, "is not a known field");
            unknown += 1;
            if unknown > MAX_LISTED_ERRORS {
                return Err(errors
                    .finish()
                    .map_or_else(ApiError::Validation, |()| ApiError::Internal));
            }
            continue;
        }
        let path = err.path().to_string();
        let field = if path.is_empty() || path == "." {
            // Missing fields are reported by serde on the parent object.
            quoted_name(&message).unwrap_or_else(|| "body".to_owned())
        } else {
            path
        };
        errors.push(&field, clean_message(&message));
        return Err(errors
            .finish()
            .map_or_else(ApiError::Validation, |()| ApiError::Internal));
    }
}

/// Reads `bytes` as one JSON value in which no object repeats a key. Well-formed JSON
/// that serde_json cannot hold is the field's fault, not the syntax's, and is a 422
/// naming it: a number beyond a double's range (`1e400`), or nesting deeper than its
/// limit of 128 levels (named by its top-level field). serde_json reports both as
/// syntax errors, told apart only by their messages.
fn read_value(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let err = match serde_path_to_error::deserialize(&mut reader) {
        Ok(UniqueKeys(value)) => {
            return reader
                .end()
                .map(|()| value)
                .map_err(|e| ApiError::MalformedJson(e.to_string()));
        }
        Err(err) => err,
    };
    let path = err.path().clone();
    let message = err.into_inner().to_string();
    let field_faults = [
        "duplicate field",
        "number out of range",
        "recursion limit exceeded",
    ];
    if !field_faults.iter().any(|fault| message.starts_with(fault)) {
        return Err(ApiError::MalformedJson(message));
    }
    // Reading stopped at that value: only a body that is JSON all through is the
    // value's fault. Skipping values checks the syntax alone (numbers unread, nesting
    // unbounded, but strings unchecked: hence the UTF-8 check).
    if let Err(syntax) = std::str::from_utf8(bytes)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| e.to_string())
        })
    {
        return Err(ApiError::MalformedJson(syntax));
    }
    let named = |field: String| {
        if field.is_empty() || field == "." {
            "body".to_owned()
        } else {
            field
        }
    };
    if message.starts_with("duplicate field") {
        let field = quoted_name(&message).unwrap_or_else(|| "body".to_owned());
        Err(ApiError::validation(&field, "is given more than once"))
    } else if message.starts_with("number out of range") {
        Err(ApiError::validation(
            &named(path.to_string()),
            "is a number too large to read",
        ))
    } else {
        let top = match path.iter().next() {
            Some(Segment::Map { key }) => key.clone(),
            _ => String::new(),
        };
        Err(ApiError::validation(
            &named(top),
            "nests deeper than 128 levels",
        ))
    }
}

/// Removes the unknown key `name` that serde reported at `path` (the key's own path, or
/// its object's) from `value`; the field's dotted name, or `None` if it is not there.
fn remove_unknown(value: &mut Value, path: &Path, name: &str) -> Option<String> {
    let mut segments: Vec<&Segment> = path.iter().collect();
    if matches!(segments.last(), Some(Segment::Map { key }) if key == name) {
        segments.pop();
    }
    let mut at = value;
    let mut field = String::new();
    for segment in segments {
        at = match (segment, at) {
            (Segment::Map { key }, Value::Object(map)) => {
                field.push_str(key);
                map.get_mut(key)?
            }
            (Segment::Seq { index }, Value::Array(items)) => {
                field.push_str(&index.to_string());
                items.get_mut(*index)?
            }
            _ => return None,
        };
        field.push('.');
    }
    at.as_object_mut()?.remove(name)?;
    field.push_str(name);
    Some(field)
}

/// A JSON value in which no object repeats a key. serde_json keeps the last of repeated
/// keys silently, so `{"quantity": 1, "quantity": 3}` would mean 3 here and perhaps 1 to
/// whatever checked the body before: refuse it instead.
struct UniqueKeys(serde_json::Value);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate field `{key}`")));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}

/// The first `name` in serde's "unknown field `name`, expected ..." style messages.
fn quoted_name(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

fn clean_message(message: &str) -> String {
    if message.starts_with("missing field") {
        "is required".to_owned()
    } else {
        message.to_owned()
    }
}

/// Path parameters with tokenmint's error contract: a segment that does not decode (bad
/// percent-encoding, invalid UTF-8) is a 422 naming the parameter, as problem+json —
/// axum's own `Path` answers it in plain text.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> axum::extract::FromRequestParts<S>
    for PathParams<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(params)) => Ok(Self(params)),
            Err(PathRejection::FailedToDeserializePathParams(failed)) => {
                let field = match failed.kind() {
                    ErrorKind::InvalidUtf8InPathParam { key }
                    | ErrorKind::ParseErrorAtKey { key, .. } => key.clone(),
                    _ => "path".to_owned(),
                };
                Err(ApiError::Validation(vec![crate::domain::FieldError::new(
                    field,
                    "must be a valid path segment (UTF-8, percent-encoded)",
                )]))
            }
            // No parameters matched: a routing bug, not the client's.
            Err(_) => Err(ApiError::Internal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::FieldError;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Body {
        token_type: Option<String>,
        count: Option<i64>,
    }

    fn errors(bytes: &str) -> Vec<FieldError> {
        match parse_json::<Body>(bytes.as_bytes()) {
            Err(ApiError::Validation(errors)) => errors,
            Ok((_, found)) => match found.finish() {
                Err(errors) => errors,
                Ok(()) => panic!("expected 422, got a body"),
            },
            Err(other) => panic!("expected 422, got {other:?}"),
        }
    }

    fn fields(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn unknown_field_is_named() {
        assert_eq!(errors(r#"{"tokenTyp": "a"}"#)[0].field, "tokenTyp");
    }

    #[test]
    fn every_unknown_field_is_named_with_the_other_faults() {
        // The known fields still parse: the body comes back with the unknown ones listed.
        let (body, found) = parse_json::<Body>(br#"{"a": 1, "tokenType": "x", "b": 2}"#).unwrap();
        assert_eq!(body.token_type.as_deref(), Some("x"));
        let found = found.finish().unwrap_err();
        assert_eq!(fields(&found), ["a", "b"]);
        assert!(found.iter().all(|e| e.message == "is not a known field"));
        // A misfit of a known field is named beside them.
        let found = errors(r#"{"a": 1, "count": "4", "b": 2}"#);
        assert_eq!(fields(&found), ["a", "b", "count"]);
    }

    #[test]
    fn wrong_type_is_named() {
        assert_eq!(errors(r#"{"count": "4"}"#)[0].field, "count");
        assert_eq!(errors(r#"{"count": 4.5}"#)[0].field, "count");
    }

    #[test]
    fn well_formed_json_serde_cannot_hold_is_a_422_naming_the_field() {
        assert_eq!(errors(r#"{"count": 1e400}"#)[0].field, "count");
        assert_eq!(errors(r#"{"a": {"b": -1e400}}"#)[0].field, "a.b");
        assert_eq!(errors("1e400")[0].field, "body");
        let deep = format!(r#"{{"count": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(errors(&deep)[0].field, "count");
        assert_eq!(
            errors(&format!("{}{}", "[".repeat(200), "]".repeat(200)))[0].field,
            "body"
        );
        // Still syntax: a truncated number, trailing text, a body cut short after a
        // number too large or deep nesting.
        let unclosed = format!(r#"{{"count": {}"#, "[".repeat(200));
        for text in [
            r#"{"count": 1e}"#,
            r#"{"count": 1} x"#,
            r#"{"count": 1e400"#,
            &unclosed,
            r#"{"count": 1, "count""#,
        ] {
            assert!(
                matches!(
                    parse_json::<Body>(text.as_bytes()),
                    Err(ApiError::MalformedJson(_))
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn a_number_too_large_beside_text_that_is_not_utf8_is_malformed() {
        let mut body = br#"{"count": 1e400, "tokenType": ""#.to_vec();
        body.extend_from_slice(&[0xFF, b'"', b'}']);
        assert!(matches!(
            parse_json::<Body>(&body),
            Err(ApiError::MalformedJson(_))
        ));
    }

    #[test]
    fn non_object_and_syntax_errors() {
        assert_eq!(errors("[1]")[0].field, "body");
        assert!(matches!(
            parse_json::<Body>(b"{"),
            Err(ApiError::MalformedJson(_))
        ));
    }

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Note {
        #[allow(dead_code)]
        reason: Option<String>,
    }

    async fn optional(content_type: Option<&str>, body: &'static str) -> Result<(), ApiError> {
        let mut request = Request::builder().method("POST").uri("/");
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let request = request.body(axum::body::Body::from(body)).unwrap();
        OptionalJsonBody::<Note>::from_request(request, &())
            .await
            .map(|_| ())
    }

    #[tokio::test]
    async fn an_optional_body_may_be_empty_or_null() {
        assert!(optional(None, "").await.is_ok());
        assert!(optional(Some("application/json"), " ").await.is_ok());
        assert!(optional(Some("application/json"), "{}").await.is_ok());
        // Found by scripts/fuzz-api.sh: openapi.yaml says the body is optional and nullable.
        assert!(optional(Some("application/json"), " null\n").await.is_ok());
        assert!(matches!(
            optional(None, "null").await,
            Err(ApiError::UnsupportedMediaType)
        ));
        assert!(matches!(
            optional(Some("application/json"), "[]").await,
            Err(ApiError::Validation(_))
        ));
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::Value;

        use super::Body;
        use crate::http::error::ApiError;
        use crate::http::extract::parse_json;
        use crate::http::issuances::IssuanceRequest;

        /// The contract: a body parses, or it is a 400 (not JSON) or a 422 (wrong shape).
        fn status<T>(result: &Result<T, ApiError>) -> u16 {
            result.as_ref().map_or_else(|e| e.problem().status, |_| 200)
        }

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(Value::from),
                ".{0,8}".prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 32, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                    prop::collection::btree_map(
                        prop_oneof![
                            Just("tokenType".to_owned()),
                            Just("count".to_owned()),
                            Just("quantity".to_owned()),
                            Just("provider".to_owned()),
                            ".{0,8}"
                        ],
                        inner,
                        0..5
                    )
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_parse_or_are_400_or_422(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
                let body = parse_json::<Body>(&bytes);
                prop_assert!(matches!(status(&body), 200 | 400 | 422), "{body:?}");
                let request = parse_json::<IssuanceRequest>(&bytes);
                prop_assert!(matches!(status(&request), 200 | 400 | 422), "{request:?}");
            }

            #[test]
            fn json_like_text_parses_or_is_400_or_422(text in r#"[{}\[\]",:0-9a-zA-Z .eE+\\-]{0,64}"#) {
                let body = parse_json::<Body>(text.as_bytes());
                prop_assert!(matches!(status(&body), 200 | 400 | 422), "{body:?}");
            }

            #[test]
            fn valid_json_is_never_a_400(value in json_value()) {
                let bytes = serde_json::to_vec(&value).unwrap();
                let body = parse_json::<Body>(&bytes);
                prop_assert!(matches!(status(&body), 200 | 422), "{body:?}");
                prop_assert!(body.is_err() || value.is_object());
                let request = parse_json::<IssuanceRequest>(&bytes);
                prop_assert!(matches!(status(&request), 200 | 422), "{request:?}");
            }

            #[test]
            fn a_repeated_key_is_a_422_naming_it(key in "[a-zA-Z]{1,10}", a in any::<i64>(), b in any::<i64>()) {
                let text = format!(r#"{{"{key}": {a}, "{key}": {b}}}"#);
                match parse_json::<Body>(text.as_bytes()) {
                    Err(ApiError::Validation(errors)) => prop_assert_eq!(&errors[0].field, &key),
                    other => prop_assert!(false, "expected 422, got {:?}", other),
                }
            }
        }
    }
}
