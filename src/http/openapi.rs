//! The OpenAPI document's own parts: its top-level info, tags and security scheme
//! (`Base`), and what every operation shares written once (`complete`): the failures of
//! every operation behind an API key (`error::KeyedErrors`) and of every JSON body
//! (`error::BodyErrors`), the headers of 401, 429 and `Retry-After` answers, and the
//! identifier patterns, taken from the domain types that enforce them. The paths come
//! from the route table (`http::route_table`), which adds each handler's annotation.

use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::schema::{Object, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, ContentBuilder, HeaderBuilder, Ref, RefOr};
use utoipa::{IntoResponses, Modify, OpenApi};

use super::{error, tokens};
use crate::domain::{
    AccountId, OBJECT_ID_PATTERN, PaymentIntentId, Provider, RedemptionReference, TokenType,
};

/// The `If-Match` header of a change for which it is optional (redeem, revoke).
pub(super) const IF_MATCH_DOC: &str = "The version the change is based on, e.g. \"3\"; or `*` (any version: the write gates on the version read), or a list (`\"1\", \"3\"`) of which any may match. Compared strongly: a weak tag (`W/\"3\"`) never matches (412)";

/// The `Idempotency-Key` header of every action a retry may repeat.
pub(super) const IDEMPOTENCY_KEY_DOC: &str = "1–255 visible ASCII characters naming this request, scoped to the API key: a retry with the same key, path and body is answered as the first request was (`Idempotent-Replayed: true`), for `idempotency.retention_hours`";

/// The document before the route table adds its paths: info, tags, the `bearer` scheme.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tokenmint",
        description = "Issues tokens for payments, exactly once per payment.\n\n\
HTTP conventions, on every operation:\n\n\
- Every error is `application/problem+json` (RFC 9457) with a stable `code`; its `type`, \
`/problems/{code}`, resolves: `GET /problems/{code}` describes it.\n\
- Every 401 carries `WWW-Authenticate`: `Bearer realm=\"tokenmint\"` for API keys \
(RFC 6750), with `error=\"invalid_token\"` when a key was presented but is unknown; \
`Signature realm=\"webhooks\", error=\"<code>\"` for webhook deliveries, which are \
authenticated by the provider's signature over the raw body (`Stripe-Signature`, or \
Standard Webhooks' `webhook-id`, `webhook-timestamp` and `webhook-signature`) instead, \
and `Basic realm=\"webhooks\", charset=\"UTF-8\"` for a delivery to a provider configured \
with Basic credentials that lacks them.\n\
- A known path with a method it does not support answers 405 `method_not_allowed` with \
an `Allow` header listing the methods it does; an unknown path answers 404 `not_found`.\n\
- `If-Match` uses RFC 9110's strong comparison: `W/\"3\"` never matches, `*` matches any \
version of an existing token, a list matches if any entry does.\n\
- `Retry-After` (429, 503) is a whole number of seconds, rounded up.\n\
- Rate limits (draft-ietf-httpapi-ratelimit-headers): a 429 carries `RateLimit-Policy` \
(`\"<limiter>\";q=<burst>;w=<seconds to refill it>`) and `RateLimit` \
(`\"<limiter>\";r=0;t=<seconds until the whole burst is back>`), and so does every answer \
an API key's limit admitted, with `r` the requests left. The limiter is `key` for a trusted \
key, `address` for a checkout key (one holding only `issuances:request`, limited per client \
address: the peer's, or from a trusted proxy the right-most untrusted `X-Forwarded-For` \
hop; IPv6 by /64), `provider` and `signature` for webhook deliveries.",
        license(name = "MIT")
    ),
    // Every failure's envelope; no annotation names it (`SharedFailures` adds it).
    components(schemas(error::Problem)),
    modifiers(&BearerAuth),
    tags(
        (name = "issuances", description = "Issue a payment's tokens exactly once"),
        (name = "tokens", description = "Read tokens and change their state through the version gate"),
        (name = "balances", description = "How many of an owner's tokens are spendable, and spending them by amount"),
        (name = "payments", description = "Payment state as reported by providers"),
        (name = "webhooks", description = "Deliveries from payment providers"),
        (name = "operations", description = "Health, readiness, metrics"),
        (name = "problems", description = "What each problem `type` (`/problems/{code}`) means"),
    )
)]
pub struct Base;

/// Completes `openapi` once the route table has added every path: documents the
/// failures, headers and patterns its operations share, which annotations do not repeat.
pub fn complete(openapi: &mut utoipa::openapi::OpenApi) {
    SharedFailures.modify(openapi);
    HttpConventions.modify(openapi);
    IdentifierPatterns.modify(openapi);
}

/// Declares the `bearer` security scheme the handlers reference.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Adds to every operation behind an API key (one with a `bearer` security requirement)
/// the failures any such operation may answer (`KeyedErrors`), and to those of them that
/// read a JSON body the body's refusals (`BodyErrors`); an operation's own description
/// of one of these statuses, if it has one, stands. Then gives every failure (4xx, 5xx)
/// described without a body the one error envelope, a `Problem` as
/// `application/problem+json`.
struct SharedFailures;

impl Modify for SharedFailures {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                let responses = &mut operation.responses.responses;
                if operation.security.as_ref().is_some_and(|s| !s.is_empty()) {
                    let mut shared = error::KeyedErrors::responses();
                    if operation.request_body.is_some() {
                        shared.extend(error::BodyErrors::responses());
                    }
                    for (status, response) in shared {
                        responses.entry(status).or_insert(response);
                    }
                }
                for (status, response) in responses.iter_mut() {
                    if let RefOr::T(response) = response
                        && response.content.is_empty()
                        && (status.starts_with('4') || status.starts_with('5'))
                    {
                        response
                            .content
                            .insert("application/problem+json".to_owned(), problem_content());
                    }
                }
            }
        }
    }
}

/// The one error envelope's content: a `Problem`.
fn problem_content() -> RefOr<Content> {
    RefOr::T(
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build(),
    )
}

/// Documents the headers every operation's answers share, without repeating them in
/// each annotation: `WWW-Authenticate` on every 401 (the bearer challenge, or the
/// signature challenge for webhook deliveries), `Retry-After` as whole seconds, and the
/// rate-limit fields on every 429.
struct HttpConventions;

impl Modify for HttpConventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let header = |schema: Type, description: String| {
            RefOr::T(
                HeaderBuilder::new()
                    .schema(Some(Object::with_type(schema)))
                    .description(Some(description))
                    .build(),
            )
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let challenge = if path.starts_with("/v1/webhooks/") {
                format!(
                    "`{}, error=\"<code>\"`: sign the raw body with the provider's configured scheme; `{}` (`basic_auth_invalid`) when the provider is configured with Basic credentials and the delivery's are missing or others",
                    error::WEBHOOK_SIGNATURE_CHALLENGE,
                    error::WEBHOOK_BASIC_CHALLENGE
                )
            } else {
                format!(
                    "`Bearer realm=\"{realm}\"`, or `Bearer realm=\"{realm}\", error=\"invalid_token\"` when the key presented is unknown",
                    realm = error::API_KEY_REALM
                )
            };
            for operation in operations(item) {
                for (status, response) in operation.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if status == "401" {
                        response.headers.insert(
                            "WWW-Authenticate".to_owned(),
                            header(Type::String, challenge.clone()),
                        );
                    }
                    if status == "429" {
                        for (name, description) in RATE_LIMIT_FIELDS {
                            response.headers.insert(
                                name.to_owned(),
                                header(Type::String, description.to_owned()),
                            );
                        }
                    }
                    if let Some(retry_after) = response.headers.get_mut("Retry-After") {
                        *retry_after = header(
                            Type::Integer,
                            "Whole seconds to wait, rounded up (at least 1)".to_owned(),
                        );
                    }
                }
            }
        }
    }
}

/// The fields of draft-ietf-httpapi-ratelimit-headers on a 429, and what they say.
const RATE_LIMIT_FIELDS: [(&str, &str); 2] = [
    (
        "RateLimit-Policy",
        "The limit that refused: `\"<limiter>\";q=<burst>;w=<seconds to refill it>`, limiter `key`, `address`, `provider` or `signature`",
    ),
    (
        "RateLimit",
        "`\"<limiter>\";r=0;t=<seconds until the whole burst is back>`",
    ),
];

/// The operations of a path, whichever methods it has.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

/// Sets the pattern of every parameter and schema property that carries an identifier
/// (or an `If-Match` precondition), by its name, from the type that enforces it: the
/// document cannot promise another alphabet than the parser accepts.
struct IdentifierPatterns;

/// Which pattern each identifier field or parameter has.
const PATTERNS: &[(&str, &str)] = &[
    ("provider", Provider::PATTERN),
    ("accountId", AccountId::PATTERN),
    ("paymentIntentId", PaymentIntentId::PATTERN),
    ("tokenType", TokenType::PATTERN),
    ("owner", OBJECT_ID_PATTERN),
    ("newOwner", OBJECT_ID_PATTERN),
    ("tokenId", OBJECT_ID_PATTERN),
    ("after", OBJECT_ID_PATTERN),
    ("If-Match", tokens::IF_MATCH_PATTERN),
];

/// The identifiers that name a resource in a URL path, which the parser also refuses as
/// `.` or `..` (`DOT_SEGMENT_RULE`): their documented pattern says so by a lookahead
/// (ECMA-262, as OpenAPI patterns are), which the parser's regex engine has not.
const PATH_SEGMENTS: &[&str] = &["accountId", "paymentIntentId", "reference"];

/// A redemption's `reference`, in the places it names one: a redeem's `reference` is
/// free text, so this one goes by schema and path, not by name alone.
const REDEMPTION_REFERENCE: &str = "reference";
const REDEMPTION_SCHEMA: &str = "RedemptionRequest";
const REDEMPTION_PATH: &str = "/v1/redemptions/";

/// The documented pattern of `name`: its parser's, with the dot-segment rule where it
/// applies.
fn pattern_of(name: &str) -> Option<String> {
    let pattern = PATTERNS
        .iter()
        .find(|(field, _)| *field == name)
        .map(|(_, pattern)| *pattern)?;
    Some(documented(name, pattern))
}

fn documented(name: &str, pattern: &str) -> String {
    match pattern.strip_prefix('^') {
        Some(rest) if PATH_SEGMENTS.contains(&name) => format!(r"^(?!\.{{1,2}}$){rest}"),
        _ => pattern.to_owned(),
    }
}

/// A redemption's reference, documented.
fn redemption_reference() -> String {
    documented(REDEMPTION_REFERENCE, RedemptionReference::PATTERN)
}

/// Sets `pattern` on `schema` when it is a string.
fn set_pattern(schema: &mut RefOr<Schema>, pattern: &str) {
    if let RefOr::T(Schema::Object(object)) = schema
        && is_string(object)
    {
        object.pattern = Some(pattern.to_owned());
    }
}

fn is_string(object: &Object) -> bool {
    use utoipa::openapi::schema::SchemaType;
    match &object.schema_type {
        SchemaType::Type(Type::String) => true,
        SchemaType::Array(types) => types.contains(&Type::String),
        _ => false,
    }
}

impl Modify for IdentifierPatterns {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for operation in operations(item) {
                for parameter in operation.parameters.iter_mut().flatten() {
                    let RefOr::T(parameter) = parameter else {
                        continue;
                    };
                    let pattern = if path.starts_with(REDEMPTION_PATH)
                        && parameter.name == REDEMPTION_REFERENCE
                    {
                        Some(redemption_reference())
                    } else {
                        pattern_of(&parameter.name)
                    };
                    if let (Some(pattern), Some(schema)) = (pattern, parameter.schema.as_mut()) {
                        set_pattern(schema, &pattern);
                    }
                }
            }
        }
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        for (schema_name, schema) in components.schemas.iter_mut() {
            if let RefOr::T(Schema::Object(object)) = schema {
                for (name, property) in object.properties.iter_mut() {
                    let pattern =
                        if schema_name == REDEMPTION_SCHEMA && name == REDEMPTION_REFERENCE {
                            Some(redemption_reference())
                        } else {
                            pattern_of(name)
                        };
                    if let Some(pattern) = pattern {
                        set_pattern(property, &pattern);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Owner;

    #[test]
    fn the_object_id_pattern_is_what_the_parser_accepts() {
        let pattern = regex::Regex::new(OBJECT_ID_PATTERN).unwrap();
        for candidate in [
            "65f1a0c2b3d4e5f601234567",
            "65F1A0C2B3D4E5F601234567",
            "65f1a0c2b3d4e5f60123456",
            "65f1a0c2b3d4e5f6012345678",
            "65f1a0c2b3d4e5f60123456g",
            " 65f1a0c2b3d4e5f601234567",
            "",
        ] {
            assert_eq!(
                pattern.is_match(candidate),
                Owner::parse(candidate).is_ok(),
                "{candidate:?}"
            );
        }
    }

    /// What the document says of who may issue, of identifiers in URL paths and of the
    /// largest quantity is what the code enforces.
    #[test]
    fn the_document_says_what_the_code_enforces() {
        let doc = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
        let issue = &doc["paths"]["/v1/issuances"]["post"];
        assert_eq!(
            issue["security"],
            serde_json::json!([{ "bearer": ["issuances:write"] }, { "bearer": ["issuances:request"] }]),
            "a trusted key or a checkout key"
        );
        let schemas = &doc["components"]["schemas"];
        let segment = |rest: &str| format!(r"^(?!\.{{1,2}}$){rest}");
        assert_eq!(
            schemas["RedemptionRequest"]["properties"]["reference"]["pattern"],
            segment(&RedemptionReference::PATTERN[1..])
        );
        assert_eq!(
            schemas["IssuanceRequest"]["properties"]["accountId"]["pattern"],
            segment(&AccountId::PATTERN[1..])
        );
        assert!(
            schemas["RedeemRequest"]["properties"]["reference"]["pattern"].is_null(),
            "a redeem's reference is free text"
        );
        for schema in ["IssuanceRequest", "RedemptionRequest"] {
            assert_eq!(
                schemas[schema]["properties"]["quantity"]["maximum"],
                crate::settings::MAX_QUANTITY,
                "{schema}"
            );
        }
    }

    #[test]
    fn every_operation_behind_a_key_documents_the_shared_failures() {
        let doc = crate::http::ApiDoc::openapi();
        let mut keyed = 0;
        for (path, item) in &doc.paths.paths {
            for operation in [&item.get, &item.post].into_iter().flatten() {
                if operation.security.is_none() {
                    continue;
                }
                keyed += 1;
                for status in ["401", "403", "429", "503"] {
                    assert!(
                        operation.responses.responses.contains_key(status),
                        "{path}: no {status}"
                    );
                }
                let Some(RefOr::T(limited)) = operation.responses.responses.get("429") else {
                    panic!("{path}: 429 not inline");
                };
                for field in ["Retry-After", "RateLimit-Policy", "RateLimit"] {
                    assert!(
                        limited.headers.contains_key(field),
                        "{path}: 429 without {field}"
                    );
                }
            }
        }
        assert_eq!(keyed, 11, "operations behind an API key");
    }
}
