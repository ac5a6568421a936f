//! Issuing, replaying, conflicting and reading back, in both modes.

use mongodb::bson::doc;
use serde_json::json;

use crate::helpers::*;

async fn replay_returns_the_same_tokens(mode: &str) {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_replay", 4);
    body["mode"] = json!(mode);

    let first = app.issue(WRITER_KEY, &body).await;
    assert_eq!(first.status(), 201);
    assert_eq!(
        first.headers()["location"],
        "/v1/issuances/stripe/acct_1/pi_replay"
    );
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = json(first).await;
    assert_eq!(first["created"], 4);
    assert_eq!(first["issuance"]["mode"], mode);

    let second = app.issue(WRITER_KEY, &body).await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let second = json(second).await;
    assert_eq!(second["created"], 0);
    assert_eq!(token_ids(&first), token_ids(&second));
    assert_eq!(
        first["issuance"]["id"], second["issuance"]["id"],
        "the answer names the stored record"
    );

    assert_eq!(app.token_indexes("pi_replay").await, vec![0, 1, 2, 3]);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    let token = app
        .db
        .collection::<mongodb::bson::Document>("tokens")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(token.get_str("status").unwrap(), "active");
    assert_eq!(token.get_str("type").unwrap(), "standard");
    assert_eq!(
        token
            .get_document("origin")
            .unwrap()
            .get_str("provider")
            .unwrap(),
        "stripe"
    );
    assert!(
        matches!(token.get("_version"), Some(v) if v.as_i32() == Some(0) || v.as_i64() == Some(0))
    );
}

#[tokio::test]
async fn upsert_replay_returns_the_same_tokens() {
    replay_returns_the_same_tokens("upsert").await;
}

#[tokio::test]
async fn atomic_replay_returns_the_same_tokens() {
    replay_returns_the_same_tokens("atomic").await;
}

async fn differing_retry_is_a_conflict(mode: &str) {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_conflict", 2);
    body["mode"] = json!(mode);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);

    let mut changed = body.clone();
    changed["owner"] = json!(OTHER_OWNER);
    changed["tokenType"] = json!("gold");
    changed["quantity"] = json!(5);
    let problem = assert_problem(
        app.issue(WRITER_KEY, &changed).await,
        409,
        "idempotency_conflict",
    )
    .await;
    let mismatches = problem["mismatches"].as_array().unwrap();
    let fields: Vec<&str> = mismatches
        .iter()
        .map(|m| m["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["owner", "tokenType", "quantity"]);
    assert_eq!(mismatches[2]["existing"], 2);
    assert_eq!(mismatches[2]["requested"], 5);

    // Each single differing field is a conflict on its own, and nothing is written.
    for (field, value) in [
        ("owner", json!(OTHER_OWNER)),
        ("tokenType", json!("gold")),
        ("quantity", json!(3)),
    ] {
        let mut one = body.clone();
        one[field] = value;
        let problem = assert_problem(
            app.issue(WRITER_KEY, &one).await,
            409,
            "idempotency_conflict",
        )
        .await;
        assert_eq!(problem["mismatches"][0]["field"], field);
    }
    assert_eq!(app.token_indexes("pi_conflict").await, vec![0, 1]);
    assert_eq!(
        app.count(
            "tokens",
            doc! { "owner": { "$ne": mongodb::bson::oid::ObjectId::parse_str(OWNER).unwrap() } }
        )
        .await,
        0
    );
    assert_eq!(app.count("issuances", doc! {}).await, 1);
}

#[tokio::test]
async fn upsert_differing_retry_is_a_conflict() {
    differing_retry_is_a_conflict("upsert").await;
}

#[tokio::test]
async fn atomic_differing_retry_is_a_conflict() {
    differing_retry_is_a_conflict("atomic").await;
}

#[tokio::test]
async fn payment_date_is_not_compared_and_kept_from_the_first_write() {
    let app = spawn_app().await;
    let mut body = issuance_body("pi_date", 1);
    body["paymentDate"] = json!("2026-09-01T00:00:00Z");
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    body["paymentDate"] = json!("2026-10-01T00:00:00Z");
    let replay = app.issue(WRITER_KEY, &body).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(
        json(replay).await["issuance"]["paymentDate"],
        "2026-09-01T00:00:00Z"
    );
}

#[tokio::test]
async fn provider_and_account_scope_separate_payments() {
    let app = spawn_app().await;
    let base = issuance_body("pi_shared", 2);
    let mut other_account = base.clone();
    other_account["accountId"] = json!("acct_2");
    let mut other_provider = base.clone();
    other_provider["provider"] = json!("adyen");
    let mut default_account = base.clone();
    default_account.as_object_mut().unwrap().remove("accountId");

    for body in [&base, &other_account, &other_provider, &default_account] {
        let response = app.issue(WRITER_KEY, body).await;
        assert_eq!(response.status(), 201, "{body}");
    }
    assert_eq!(
        app.count("issuances", doc! { "paymentIntentId": "pi_shared" })
            .await,
        4
    );
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pi_shared" })
            .await,
        8
    );
    assert_eq!(
        app.count("issuances", doc! { "accountId": "default" })
            .await,
        1
    );
}

#[tokio::test]
async fn issuance_reads_back_with_its_tokens() {
    let app = spawn_app().await;
    let created = json(app.issue(WRITER_KEY, &issuance_body("pi_read", 3)).await).await;

    let read = app
        .get(READER_KEY, "/v1/issuances/stripe/acct_1/pi_read")
        .await;
    assert_eq!(read.status(), 200);
    let read = json(read).await;
    assert_eq!(token_ids(&read), token_ids(&created));
    assert_eq!(read["issuance"]["quantity"], 3);
    assert!(read.get("created").is_none());

    assert_problem(
        app.get(READER_KEY, "/v1/issuances/stripe/acct_1/pi_nope")
            .await,
        404,
        "not_found",
    )
    .await;
    let bad = assert_problem(
        app.get(READER_KEY, "/v1/issuances/Stripe/acct_1/pi_read")
            .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(bad["errors"][0]["field"], "provider");
}

#[tokio::test]
async fn a_partial_issuance_is_completed_by_the_retry() {
    let app = spawn_app().await;
    let body = issuance_body("pi_partial", 5);
    let first = json(app.issue(WRITER_KEY, &body).await).await;
    let kept: Vec<String> = token_ids(&first)[..2].to_vec();
    // Simulate a crash between the record and the token writes: only tokens 0 and 1 made it.
    app.db
        .collection::<mongodb::bson::Document>("tokens")
        .delete_many(doc! { "tokenIndex": { "$gte": 2 } })
        .await
        .unwrap();
    assert_eq!(app.token_indexes("pi_partial").await, vec![0, 1]);

    let retry = app.issue(WRITER_KEY, &body).await;
    assert_eq!(retry.status(), 200);
    let retry = json(retry).await;
    assert_eq!(retry["created"], 3);
    assert_eq!(
        token_ids(&retry)[..2],
        kept[..],
        "existing tokens are kept, not replaced"
    );
    assert_eq!(app.token_indexes("pi_partial").await, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_crash_after_the_record_but_before_any_token_is_completed() {
    // The record is written first; a crash right after it leaves a payment with no tokens,
    // and the retry must issue all of them (once).
    let app = spawn_app().await;
    let body = issuance_body("pi_crash", 3);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    app.db
        .collection::<mongodb::bson::Document>("tokens")
        .delete_many(doc! {})
        .await
        .unwrap();
    let retry = app.issue(WRITER_KEY, &body).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(json(retry).await["created"], 3);
    assert_eq!(app.token_indexes("pi_crash").await, vec![0, 1, 2]);
}
