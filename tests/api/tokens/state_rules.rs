//! Redeem, revoke and transfer one at a time: what each status allows, what `If-Match`
//! requires, and the bad requests that change nothing.

use serde_json::{Value, json};

use super::{change, post, transfer, version_of};
use crate::helpers::*;

/// Asks for `operation` on token `id` at `version` (a transfer with the `If-Match` and new
/// owner it requires, the others without) and asserts the token's state refuses it.
async fn assert_state_conflict(app: &TestApp, id: &str, operation: &str, version: i64) -> Value {
    let transfer = operation == "transfer";
    let if_match = format!("\"{version}\"");
    let response = change(
        app,
        ADMIN_KEY,
        id,
        operation,
        transfer.then_some(if_match.as_str()),
        transfer.then(|| json!({"newOwner": OTHER_OWNER})),
    )
    .await;
    assert_problem(response, 409, "state_conflict").await
}

#[tokio::test]
async fn redeem_then_the_state_rules() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_rules", 3).await;
    let (a, b, c) = (&ids[0], &ids[1], &ids[2]);

    // Redeem with a reference; the answer carries the new ETag.
    let response = change(
        &app,
        ADMIN_KEY,
        a,
        "redeem",
        Some("\"0\""),
        Some(json!({"reference": "order-7"})),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["etag"], "\"1\"");
    let token = json(response).await;
    assert_eq!(token["status"], "redeemed");
    assert_eq!(token["redemptionRef"], "order-7");
    let db = app.stored_token(a).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(version_of(&db), 1);
    assert!(db.get_datetime("redeemedAt").is_ok());

    // Redeem / transfer / revoke of a redeemed token: 409, nothing changes.
    for operation in ["redeem", "transfer", "revoke"] {
        let problem = assert_state_conflict(&app, a, operation, 1).await;
        assert_eq!(problem["currentStatus"], "redeemed", "{operation}");
    }
    assert_eq!(version_of(&app.stored_token(a).await), 1);

    // Revoke (empty body) then revoke again: 200 both times, version bumped once.
    let first = change(&app, ADMIN_KEY, b, "revoke", None, None).await;
    assert_eq!(first.status(), 200);
    let second = change(&app, ADMIN_KEY, b, "revoke", None, Some(json!({}))).await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["etag"], "\"1\"");
    assert_eq!(version_of(&app.stored_token(b).await), 1);
    // Redeem / transfer of a revoked token: 409.
    for operation in ["redeem", "transfer"] {
        let problem = assert_state_conflict(&app, b, operation, 1).await;
        assert_eq!(problem["currentStatus"], "revoked", "{operation}");
    }
    assert_eq!(version_of(&app.stored_token(b).await), 1);

    // Transfer: If-Match required, then moves the owner and bumps the version.
    let missing = transfer(&app, c, None).await;
    assert_problem(missing, 428, "precondition_required").await;
    let bad_owner = change(
        &app,
        ADMIN_KEY,
        c,
        "transfer",
        Some("\"0\""),
        Some(json!({"newOwner": "nope"})),
    )
    .await;
    assert_eq!(
        assert_problem(bad_owner, 422, "validation_failed").await["errors"][0]["field"],
        "newOwner"
    );
    let moved = transfer(&app, c, Some("\"0\"")).await;
    assert_eq!(moved.status(), 200);
    let db = app.stored_token(c).await;
    assert_eq!(db.get_object_id("owner").unwrap().to_hex(), OTHER_OWNER);
    assert_eq!(version_of(&db), 1);
}

#[tokio::test]
async fn bad_requests_to_state_changes() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_bad", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    assert_problem(
        post(&app, ADMIN_KEY, "/v1/tokens/xyz/redeem", None, None).await,
        422,
        "validation_failed",
    )
    .await;
    let bad_match = assert_problem(
        post(&app, ADMIN_KEY, &path, Some("\"abc\""), None).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(bad_match["errors"][0]["field"], "If-Match");
    let unknown = assert_problem(
        post(
            &app,
            ADMIN_KEY,
            &path,
            None,
            Some(json!({"referense": "x"})),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(unknown["errors"][0]["field"], "referense");
    let long = post(
        &app,
        ADMIN_KEY,
        &path,
        None,
        Some(json!({"reference": "x".repeat(257)})),
    )
    .await;
    assert_problem(long, 422, "validation_failed").await;
    // Every bad field at once, the token id among them, before a missing If-Match.
    let fields = |problem: Value| -> Vec<String> {
        problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap().to_owned())
            .collect()
    };
    let both = post(
        &app,
        ADMIN_KEY,
        "/v1/tokens/xyz/redeem",
        None,
        Some(json!({"reference": "x".repeat(257)})),
    )
    .await;
    let both = assert_problem(both, 422, "validation_failed").await;
    assert_eq!(fields(both), ["tokenId", "reference"]);
    let transfer = post(
        &app,
        ADMIN_KEY,
        "/v1/tokens/xyz/transfer",
        None,
        Some(json!({"newOwner": "nope"})),
    )
    .await;
    let transfer = assert_problem(transfer, 422, "validation_failed").await;
    assert_eq!(fields(transfer), ["tokenId", "newOwner"]);
    // A value of the wrong JSON type is one bad field among the others too.
    for (action, body, field) in [
        ("redeem", json!({"reference": 5}), "reference"),
        ("revoke", json!({"reason": false}), "reason"),
        ("transfer", json!({"newOwner": 5}), "newOwner"),
    ] {
        let path = format!("/v1/tokens/xyz/{action}");
        let answer = post(&app, ADMIN_KEY, &path, None, Some(body)).await;
        let problem = assert_problem(answer, 422, "validation_failed").await;
        assert_eq!(
            problem["errors"][1]["message"], "must be a string",
            "{problem}"
        );
        assert_eq!(fields(problem), ["tokenId", field], "{action}");
    }
    assert_problem(
        post(&app, READER_KEY, &path, None, None).await,
        403,
        "forbidden",
    )
    .await;
    assert_problem(
        change(&app, WRITER_KEY, &id, "revoke", None, None).await,
        403,
        "forbidden",
    )
    .await;
    assert_problem(
        change(
            &app,
            READER_KEY,
            &id,
            "transfer",
            Some("\"0\""),
            Some(json!({"newOwner": OTHER_OWNER})),
        )
        .await,
        403,
        "forbidden",
    )
    .await;
    let db = app.stored_token(&id).await;
    assert_eq!(db.get_str("status").unwrap(), "active");
    assert_eq!(version_of(&db), 0);
}

#[tokio::test]
async fn a_stale_if_match_is_412_and_changes_nothing() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_stale", 1).await.remove(0);
    let moved = transfer(&app, &id, Some("\"0\"")).await;
    assert_eq!(moved.status(), 200);

    let stale = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), None).await;
    let problem = assert_problem(stale, 412, "version_conflict").await;
    assert_eq!(problem["currentVersion"], 1);
    assert_eq!(problem["currentStatus"], "active");
    let db = app.stored_token(&id).await;
    assert_eq!(db.get_str("status").unwrap(), "active");
    assert_eq!(version_of(&db), 1);

    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "tokenmint_version_gate_rejections_total{collection=\"tokens\",operation=\"redeem\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_key_that_may_not_read_learns_no_version_from_a_412() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_stale_blind", 1).await.remove(0);
    assert_eq!(transfer(&app, &id, Some("\"0\"")).await.status(), 200);

    let stale = change(&app, REDEEMER_KEY, &id, "redeem", Some("\"7\""), None).await;
    let problem = assert_problem(stale, 412, "version_conflict").await;
    assert!(problem.get("currentVersion").is_none(), "{problem}");
    assert!(problem.get("currentStatus").is_none(), "{problem}");
    assert!(
        !problem["detail"].as_str().unwrap().contains('1'),
        "{problem}"
    );
    // A key that may read is told where the token is.
    let stale = change(&app, ADMIN_KEY, &id, "redeem", Some("\"7\""), None).await;
    assert_eq!(
        assert_problem(stale, 412, "version_conflict").await["currentVersion"],
        1
    );
    // Without If-Match the redeem-only key still does its job.
    let redeemed = change(&app, REDEEMER_KEY, &id, "redeem", None, None).await;
    assert_eq!(redeemed.status(), 200);
    let db = app.stored_token(&id).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(version_of(&db), 2);
}

/// The README's redeem walk-through, step by step as written: a redeem at the version
/// read, its retry (a replay), a second redeem with another reference at the current
/// version (409) and at the stale one (412), the token redeemed once throughout.
#[tokio::test]
async fn the_readme_redeem_walkthrough_answers_as_documented() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_readme_redeem", 1).await.remove(0);
    let order_42 = || Some(json!({"reference": "order-42"}));
    let order_43 = || Some(json!({"reference": "order-43"}));

    let first = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), order_42()).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["etag"], "\"1\"");

    let retry = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), order_42()).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");

    let again = change(&app, ADMIN_KEY, &id, "redeem", Some("\"1\""), order_43()).await;
    assert_problem(again, 409, "state_conflict").await;

    let stale = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), order_43()).await;
    let problem = assert_problem(stale, 412, "version_conflict").await;
    assert_eq!(problem["currentVersion"], 1);

    let db = app.stored_token(&id).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(db.get_str("redemptionRef").unwrap(), "order-42");
    assert_eq!(version_of(&db), 1);
}

/// A redeem whose write applied on the primary but whose time limit (1 s, set so that a
/// token another transaction holds is not waited for until the server ends that
/// transaction) ran out while it waited for the majority: the write concern error
/// `MaxTimeMSExpired` a majority a second behind makes. That limit is not the patience
/// for durability: the redeem goes on waiting for the majority and is answered 200 once
/// the majority shows it, redeemed once. Without a key (its token write), and with an
/// `Idempotency-Key` (its record's claim, bound the same way), whose retry replays it.
#[tokio::test]
async fn a_write_out_of_time_waiting_for_the_majority_is_answered_once_durable() {
    const OUT_OF_TIME: Fault = Fault::WriteConcernError { code: 50 };
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let ids = app.issue_tokens("pi_out_of_time", 2).await;

    let tokens = format!("{}.tokens", app.db_name);
    let failpoint = FailPoint::set_on(&name, &["findAndModify"], &tokens, OUT_OF_TIME, 1).await;
    let plain = change(&app, ADMIN_KEY, &ids[0], "redeem", None, None).await;
    assert_eq!(
        failpoint.off().await,
        1,
        "the redeem's write ran out of time"
    );
    assert_eq!(plain.status(), 200, "{}", plain.text().await.unwrap());
    let db = app.stored_token(&ids[0]).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(version_of(&db), 1, "redeemed once");

    let records = format!("{}.idempotency_keys", app.db_name);
    let keyed = || {
        app.http
            .post(format!("{}/v1/tokens/{}/redeem", app.address, ids[1]))
            .bearer_auth(ADMIN_KEY)
            .header("Idempotency-Key", "out-of-time")
            .send()
    };
    let failpoint = FailPoint::set_on(&name, &["findAndModify"], &records, OUT_OF_TIME, 1).await;
    let first = keyed().await.unwrap();
    assert_eq!(failpoint.off().await, 1, "the key's claim ran out of time");
    assert_eq!(first.status(), 200, "{}", first.text().await.unwrap());
    let retry = keyed().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let db = app.stored_token(&ids[1]).await;
    assert_eq!(db.get_str("status").unwrap(), "redeemed");
    assert_eq!(version_of(&db), 1, "redeemed once");
}

/// A redeem with its `reference` that applied but whose majority did not confirm it in
/// time (a write concern error, as a URI's `wtimeoutMS` makes of lagging secondaries):
/// 503 `database_unavailable`, and the retry, at the same `If-Match`, replays it (200,
/// the token redeemed once, with the reference), as the problem type promises for a
/// request that is safe to retry.
#[tokio::test]
async fn a_redeem_the_majority_did_not_confirm_in_time_is_replayed_by_its_retry() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_unconfirmed_redeem", 1).await.remove(0);
    let order = || Some(json!({"reference": "order-unconfirmed"}));
    let failpoint = FailPoint::set(
        &name,
        &["findAndModify"],
        Fault::WriteConcernError { code: 64 },
        1,
    )
    .await;
    let failed = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), order()).await;
    assert_eq!(failpoint.off().await, 1, "the redeem's write failed");
    assert_problem(failed, 503, "database_unavailable").await;
    assert_eq!(
        app.stored_token(&id).await.get_str("status").unwrap(),
        "redeemed",
        "the write applied"
    );

    // Quick enough that the retry's majority read may still show the token active: its
    // gated write then misses, and the read after it tells its own first attempt.
    let retry = change(&app, ADMIN_KEY, &id, "redeem", Some("\"0\""), order()).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let db = app.stored_token(&id).await;
    assert_eq!(db.get_str("redemptionRef").unwrap(), "order-unconfirmed");
    assert_eq!(version_of(&db), 1, "redeemed once");
}
