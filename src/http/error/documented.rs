//! The failures many operations share, documented once: those of every operation behind
//! an API key (`KeyedErrors`) and those of every operation that reads a JSON body
//! (`BodyErrors`). The OpenAPI document adds them to each such operation
//! (`http::openapi::complete`), so no annotation lists them.

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::{HeaderBuilder, RefOr};

/// The failures every operation behind an API key may answer, whatever it does: no or
/// an unknown key (401), a key without the scope or the account (403), the key's rate
/// limit (429), and the database or the request running out of time (503).
pub struct KeyedErrors;

impl IntoResponses for KeyedErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems([
            ("401", "`unauthorized`: missing or unknown API key"),
            (
                "403",
                "`forbidden`: the key lacks the scope, or may not act on the account the request names",
            ),
            (
                "429",
                "`rate_limited`: the key exceeded its rate limit (a checkout key: its client address did); see Retry-After",
            ),
            (
                "503",
                "`database_unavailable` or `request_timeout`: retry after Retry-After",
            ),
        ])
    }
}

/// The refusals of a JSON body before its handler reads it (`http::extract`): JSON that
/// does not parse (400), a body over the limit (413), a body that is not
/// `application/json` (415).
pub struct BodyErrors;

impl IntoResponses for BodyErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems([
            ("400", "Malformed JSON"),
            ("413", "Body too large"),
            ("415", "A body that is not application/json"),
        ])
    }
}

/// The failures of these statuses, each with its description.
fn problems<const N: usize>(answers: [(&str, &str); N]) -> BTreeMap<String, RefOr<Response>> {
    answers
        .into_iter()
        .map(|(status, description)| (status.to_owned(), RefOr::T(problem(description))))
        .collect()
}

/// A failure described by `description` (the document gives it the problem+json
/// envelope); 429 and 503 also carry `Retry-After`, which the OpenAPI document's
/// conventions (`http::openapi`) describe.
fn problem(description: &str) -> Response {
    let mut response = ResponseBuilder::new().description(description);
    if description.contains("Retry-After") {
        response = response.header("Retry-After", HeaderBuilder::new().build());
    }
    response.build()
}
