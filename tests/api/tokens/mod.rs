//! The token lifecycle through the `_version` gate: reading and listing tokens, the
//! state rules of redeem, revoke and transfer, and concurrent writers of one token.

mod concurrency;
mod reads;
mod state_rules;

use mongodb::bson::Document;
use serde_json::{Value, json};

use crate::helpers::*;

/// POSTs to `path` as `key`, with `If-Match` and a JSON body when given.
async fn post(
    app: &TestApp,
    key: &str,
    path: impl Into<String>,
    if_match: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app.http.post(app.url(&path.into())).bearer_auth(key);
    if let Some(version) = if_match {
        request = request.header("if-match", version);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// Asks for `operation` (redeem, revoke or transfer) on token `id` as `key`, with
/// `If-Match` and a JSON body when given.
async fn change(
    app: &TestApp,
    key: &str,
    id: &str,
    operation: &str,
    if_match: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    post(
        app,
        key,
        format!("/v1/tokens/{id}/{operation}"),
        if_match,
        body,
    )
    .await
}

/// Transfers token `id` to `OTHER_OWNER` as the admin, with `If-Match` when given.
async fn transfer(app: &TestApp, id: &str, if_match: Option<&str>) -> reqwest::Response {
    let body = json!({ "newOwner": OTHER_OWNER });
    change(app, ADMIN_KEY, id, "transfer", if_match, Some(body)).await
}

/// A stored token's `_version`.
fn version_of(token: &Document) -> i64 {
    stored_int(token, "_version").expect("a token has a _version")
}
