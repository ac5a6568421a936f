//! The failures every operation behind an API key may answer, documented once
//! (`KeyedErrors`) for the handlers' annotations to list after their own.

use std::collections::BTreeMap;

use utoipa::IntoResponses;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr};

/// The failures every operation behind an API key may answer, whatever it does: no or
/// an unknown key (401), a key without the scope or the account (403), the key's rate
/// limit (429), and the database or the request running out of time (503). Listed in an
/// operation's `responses(...)` after its own.
pub struct KeyedErrors;

impl IntoResponses for KeyedErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        [
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
        ]
        .into_iter()
        .map(|(status, description)| (status.to_owned(), RefOr::T(problem(description))))
        .collect()
    }
}

/// A problem+json answer described by `description`; 429 and 503 also carry
/// `Retry-After`, which the OpenAPI document's conventions (`http::openapi`) describe.
fn problem(description: &str) -> Response {
    let mut response = ResponseBuilder::new().description(description).content(
        "application/problem+json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build(),
    );
    if description.contains("Retry-After") {
        response = response.header("Retry-After", HeaderBuilder::new().build());
    }
    response.build()
}
