//! Retries of token actions: a redeem retried with its `reference`, and the
//! `Idempotency-Key` header on redeem, revoke and transfer (kept in MongoDB, so any
//! instance answers the retry; bound to the API key, method, path and body), and its
//! answer committed with the action (`reruns`).

mod keys;
mod references;
mod reruns;

use mongodb::bson::{Document, doc};
use serde_json::Value;

use crate::helpers::*;

/// POSTs `body` (JSON, when given) to `path` as `key`, with `Idempotency-Key` and
/// `If-Match` when given.
async fn post(
    app: &TestApp,
    key: &str,
    path: &str,
    idempotency_key: Option<&str>,
    if_match: Option<&str>,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut request = app.http.post(app.url(path)).bearer_auth(key);
    if let Some(idempotency_key) = idempotency_key {
        request = request.header("idempotency-key", idempotency_key);
    }
    if let Some(if_match) = if_match {
        request = request.header("if-match", if_match);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.expect("request sent")
}

/// Redeems token `id` as `key` with the Idempotency-Key `idempotency_key`, and reads the
/// answer as a client sees it.
async fn redeem_keyed(app: &TestApp, key: &str, id: &str, idempotency_key: &str) -> Seen {
    let path = format!("/v1/tokens/{id}/redeem");
    seen(post(app, key, &path, Some(idempotency_key), None, None).await).await
}

/// An answer as a client sees it: status, replay marker, ETag and body bytes.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    replayed: bool,
    etag: Option<String>,
    body: Vec<u8>,
}

async fn seen(response: reqwest::Response) -> Seen {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let etag = header("etag");
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap().to_vec();
    Seen {
        status,
        replayed,
        etag,
        body,
    }
}

/// The `idempotency_keys` records of API key `key_id`.
async fn key_records(app: &TestApp, key_id: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    app.db
        .collection::<Document>("idempotency_keys")
        .find(doc! { "keyId": key_id })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}
