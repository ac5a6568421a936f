//! Reading and asserting what the service answers, and the tokens stored behind it.

use futures::TryStreamExt;
use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use serde_json::Value;

/// The token ids of one answer or of a payment's stored set, as (tokenIndex, id) in
/// tokenIndex order: what the fault-injection suites compare across a crash or failover.
pub type TokenIds = Vec<(i64, String)>;

/// The documents of `collection` in `db` that match `filter`, in `sort` order: the one
/// query behind the readers below.
async fn find_sorted(
    db: &Database,
    collection: &str,
    filter: Document,
    sort: Document,
) -> Vec<Document> {
    db.collection::<Document>(collection)
        .find(filter)
        .sort(sort)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Every token stored for `payment` in `db`, in tokenIndex order.
pub async fn payment_tokens(db: &Database, payment: &str) -> Vec<Document> {
    let filter = doc! { "origin.paymentIntentId": payment };
    find_sorted(db, "tokens", filter, doc! { "tokenIndex": 1 }).await
}

/// Every document of `collection` in `db`, in `_id` order: a whole collection as it
/// stands, to compare with what it was before or with what a test expects.
pub async fn documents_by_id(db: &Database, collection: &str) -> Vec<Document> {
    find_sorted(db, collection, doc! {}, doc! { "_id": 1 }).await
}

/// A stored token's tokenIndex, whichever integer type holds it.
pub fn token_index(token: &Document) -> i64 {
    match token.get("tokenIndex") {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        other => panic!("bad tokenIndex {other:?}"),
    }
}

/// The integer `field` of a stored document, whichever BSON width it was written with
/// (`None` when absent; any other type is a failed test).
pub fn stored_int(doc: &Document, field: &str) -> Option<i64> {
    match doc.get(field)? {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        other => panic!("{field} is not an integer: {other:?}"),
    }
}

/// The Prometheus text `{base}/metrics` serves (no key needed there).
pub async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the /metrics text")
}

/// The value of the sample `series` (a metric name with its labels as printed, such as
/// `tokenmint_repairs_total{outcome="completed"}`) in a `/metrics` text, if present.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().expect("a numeric sample"))
}

/// The (tokenIndex, status) list where `statuses[i]` is the status of tokenIndex i: what
/// [`TestApp::token_states`](crate::TestApp::token_states) answers for such a set.
pub fn indexed_statuses(statuses: &[&str]) -> Vec<(i64, String)> {
    (0..)
        .zip(statuses)
        .map(|(index, status)| (index, (*status).to_owned()))
        .collect()
}

/// A stored token as (tokenIndex, id), the shape of [`TokenIds`].
pub fn indexed_id(token: &Document) -> (i64, String) {
    (
        token_index(token),
        token.get_object_id("_id").expect("a token's _id").to_hex(),
    )
}

/// Reads a JSON body, asserting the content type family.
pub async fn json(response: reqwest::Response) -> Value {
    response.json().await.expect("JSON body")
}

/// Asserts a problem+json answer with `status` and `code`; returns the body.
pub async fn assert_problem(response: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "status");
    let content_type = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status);
    body
}

/// Asserts a checkout key's 409 `idempotency_conflict`: no `mismatches`, and a detail that
/// names no field — a public key learns nothing it did not send. Returns the body.
pub async fn assert_hidden_conflict(response: reqwest::Response) -> Value {
    let problem = assert_problem(response, 409, "idempotency_conflict").await;
    assert!(
        problem.get("mismatches").is_none(),
        "a checkout key is not told which fields differ: {problem}"
    );
    for field in ["owner", "tokenType", "quantity", "accountId", "mode"] {
        assert!(
            !problem["detail"].as_str().unwrap().contains(field),
            "the detail names {field}: {problem}"
        );
    }
    problem
}

/// The ids of the tokens an answer names (an issuance's or a redemption's: both list them
/// as `tokens`), in order; panics when it has no `tokens`.
pub fn token_ids(body: &Value) -> Vec<String> {
    body["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("tokens in {body}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The (tokenIndex, id) of an issuance answer's tokens, in order. Lenient where
/// [`token_ids`] panics: an answer without tokens is an empty set and a token without an
/// index or id shows as `-1` or `""`, so a fault-injection suite reports it as a
/// violation among the others instead of stopping at the first.
pub fn indexed_token_ids(body: &Value) -> TokenIds {
    body["tokens"]
        .as_array()
        .map(|tokens| {
            tokens
                .iter()
                .map(|t| {
                    (
                        t["tokenIndex"].as_i64().unwrap_or(-1),
                        t["id"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `ids` is exactly tokenIndex 0..quantity-1, in order, each with an id.
pub fn is_full_set(ids: &TokenIds, quantity: i64) -> bool {
    ids.len() as i64 == quantity
        && ids
            .iter()
            .enumerate()
            .all(|(i, (index, id))| *index == i as i64 && !id.is_empty())
}

/// The `field`s of a 422 answer's `errors`.
pub fn error_fields(problem: &Value) -> Vec<String> {
    problem["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("errors listed: {problem}"))
        .iter()
        .map(|e| {
            assert!(
                e["message"].as_str().is_some_and(|m| !m.is_empty()),
                "every error has a message: {problem}"
            );
            e["field"].as_str().unwrap().to_owned()
        })
        .collect()
}
