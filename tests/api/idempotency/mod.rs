//! Retries of token actions: a redeem retried with its `reference`, and the
//! `Idempotency-Key` header on redeem, revoke and transfer (kept in MongoDB, so any
//! instance answers the retry; bound to the API key, method, path and body), and its
//! answer committed with the action (`reruns`), also for a refusal the money could lift
//! later (`withdrawals`).

mod keys;
mod references;
mod reruns;
mod withdrawals;

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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

/// Sends the transfer of token `id` (at version 0) to `OTHER_OWNER` as the admin with the
/// Idempotency-Key `idempotency_key`: the request every transfer retry here sends again,
/// byte for byte.
async fn send_transfer(app: &TestApp, id: &str, idempotency_key: &str) -> reqwest::Response {
    let path = format!("/v1/tokens/{id}/transfer");
    let body = json!({ "newOwner": OTHER_OWNER });
    post(
        app,
        ADMIN_KEY,
        &path,
        Some(idempotency_key),
        Some("\"0\""),
        Some(&body),
    )
    .await
}

/// [`send_transfer`], its answer read as a client sees it.
async fn transfer_keyed(app: &TestApp, id: &str, idempotency_key: &str) -> Seen {
    seen(send_transfer(app, id, idempotency_key).await).await
}

/// POSTs the redemption `body` to `/v1/redemptions` as the admin, with the
/// Idempotency-Key `idempotency_key` when given.
async fn post_redemption(
    app: &TestApp,
    idempotency_key: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    post(
        app,
        ADMIN_KEY,
        "/v1/redemptions",
        idempotency_key,
        None,
        Some(body),
    )
    .await
}

/// Asserts that token `id` was transferred exactly once: its version is 1 and its owner
/// `OTHER_OWNER`. `what` names the case in the failure messages.
async fn assert_transferred_once(app: &TestApp, id: &str, what: &str) {
    let token = app.stored_token(id).await;
    assert_eq!(
        stored_int(&token, "_version"),
        Some(1),
        "{what}: transferred once"
    );
    assert_eq!(
        token.get_object_id("owner").unwrap().to_hex(),
        OTHER_OWNER,
        "{what}: the new owner"
    );
}

/// The stored status of token `id`.
async fn token_status(app: &TestApp, id: &str) -> String {
    app.stored_token(id)
        .await
        .get_str("status")
        .unwrap()
        .to_owned()
}

/// The stored version of token `id` (`_version`).
async fn token_version(app: &TestApp, id: &str) -> Option<i64> {
    stored_int(&app.stored_token(id).await, "_version")
}

/// Of answers to one keyed request sent many times at once, the one that ran the action
/// (200, not a replay), asserted to be the only one; every other must replay its body or
/// be told the first attempt is still running (409 `request_in_progress`).
fn the_one_that_ran(answers: &[Seen]) -> &Seen {
    let ran: Vec<&Seen> = answers
        .iter()
        .filter(|a| a.status == 200 && !a.replayed)
        .collect();
    assert_eq!(ran.len(), 1, "{answers:?}");
    for answer in answers {
        match (answer.status, answer.replayed) {
            (200, _) => assert_eq!(answer.body, ran[0].body),
            (409, false) => {
                let problem: Value = serde_json::from_slice(&answer.body).unwrap();
                assert_eq!(problem["code"], "request_in_progress", "{problem}");
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    ran[0]
}

/// Writes the admin's `idempotency_keys` record of `key` for a POST to `path` with `body`
/// as an attempt that never answered would have left it: no answer, another attempt's id,
/// its lease running until `lease_until`, and kept long after the test.
async fn insert_unanswered_record(
    app: &TestApp,
    key: &str,
    path: &str,
    body: &[u8],
    lease_until: DateTime,
) {
    app.db
        .collection::<Document>("idempotency_keys")
        .insert_one(doc! {
            "keyId": "admin", "key": key, "method": "POST", "path": path,
            "bodySha256": hex::encode(Sha256::digest(body)),
            "attempt": ObjectId::new(), "leaseUntil": lease_until,
            "createdAt": DateTime::now(), "expiresAt": DateTime::from_millis(i64::MAX / 2),
        })
        .await
        .unwrap();
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
