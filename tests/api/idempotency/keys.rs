//! `Idempotency-Key` on redeem, revoke and transfer: a retry answers the first request's
//! status and body, whatever happened to the token since; the key names one request of
//! one API key; a request still running holds its key.

use futures::future::join_all;
use mongodb::bson::{DateTime, doc};
use serde_json::json;

use super::{
    assert_transferred_once, insert_unanswered_record, key_records, post, redeem_keyed, seen,
    the_one_that_ran, token_status, token_version, transfer_keyed,
};
use crate::helpers::*;

#[tokio::test]
async fn retried_redeem_transfer_and_revoke_answer_as_the_first_and_change_once() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_key_retries", 3).await;
    let transfer = json!({ "newOwner": OTHER_OWNER });
    let revoke = json!({ "reason": "fraud" });
    let cases = [
        ("redeem", &ids[0], None, None),
        ("transfer", &ids[1], Some("\"0\""), Some(&transfer)),
        ("revoke", &ids[2], None, Some(&revoke)),
    ];
    for (operation, id, if_match, body) in cases {
        let path = format!("/v1/tokens/{id}/{operation}");
        let key = format!("retry-{operation}");
        let first = seen(post(&app, ADMIN_KEY, &path, Some(&key), if_match, body).await).await;
        assert_eq!(first.status, 200, "{operation}");
        assert!(!first.replayed, "{operation}");
        let stored = app.stored_token(id).await;
        assert_eq!(stored_int(&stored, "_version"), Some(1), "{operation}");

        // The answer was lost: the client sends the same request again, twice.
        for _ in 0..2 {
            let retry = seen(post(&app, ADMIN_KEY, &path, Some(&key), if_match, body).await).await;
            assert!(retry.replayed, "{operation}");
            assert_eq!(
                (retry.status, &retry.etag, &retry.body),
                (first.status, &first.etag, &first.body),
                "{operation}: the retry answers exactly as the first attempt did"
            );
        }
        assert_eq!(
            app.stored_token(id).await,
            stored,
            "{operation}: one change"
        );
    }
    let records = key_records(&app, "admin").await;
    assert_eq!(records.len(), 3);
    for record in &records {
        assert!(record.get_document("answer").is_ok(), "{record}");
        let kept = record.get_datetime("expiresAt").unwrap().timestamp_millis()
            - record.get_datetime("createdAt").unwrap().timestamp_millis();
        assert_eq!(kept, 24 * 3600 * 1000, "idempotency.retention_hours");
    }
}

#[tokio::test]
async fn a_key_used_for_another_path_or_body_is_refused_and_writes_nothing() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_key_reused", 2).await;
    let redeem = |id: &str| format!("/v1/tokens/{id}/redeem");
    let first = post(&app, ADMIN_KEY, &redeem(&ids[0]), Some("k1"), None, None).await;
    assert_eq!(first.status(), 200);

    // Another path (another token) with the same key.
    let other_path = post(&app, ADMIN_KEY, &redeem(&ids[1]), Some("k1"), None, None).await;
    assert_problem(other_path, 422, "idempotency_key_reused").await;
    // The same path with another body.
    let body = json!({ "reference": "order-9" });
    let other_body = post(
        &app,
        ADMIN_KEY,
        &redeem(&ids[0]),
        Some("k1"),
        None,
        Some(&body),
    )
    .await;
    assert_problem(other_body, 422, "idempotency_key_reused").await;
    // A transfer's key reused for another new owner.
    let path = format!("/v1/tokens/{}/transfer", ids[1]);
    let to = |owner: &str| json!({ "newOwner": owner });
    let moved = post(
        &app,
        ADMIN_KEY,
        &path,
        Some("k2"),
        Some("\"0\""),
        Some(&to(OTHER_OWNER)),
    )
    .await;
    assert_eq!(moved.status(), 200);
    let elsewhere = "65f1a0c2b3d4e5f60123456a";
    let again = post(
        &app,
        ADMIN_KEY,
        &path,
        Some("k2"),
        Some("\"1\""),
        Some(&to(elsewhere)),
    )
    .await;
    assert_problem(again, 422, "idempotency_key_reused").await;

    let second = app.stored_token(&ids[1]).await;
    assert_eq!(second.get_str("status").unwrap(), "active");
    assert_eq!(second.get_object_id("owner").unwrap().to_hex(), OTHER_OWNER);
    assert_eq!(stored_int(&second, "_version"), Some(1));
    assert_eq!(key_records(&app, "admin").await.len(), 2);
}

#[tokio::test]
async fn keys_are_scoped_per_api_key() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_key_scoped", 2).await;
    let admin = redeem_keyed(&app, ADMIN_KEY, &ids[0], "shared").await;
    // Another API key with the same Idempotency-Key: its own request, not a reuse of
    // the admin's nor a replay of its answer.
    let other = redeem_keyed(&app, ACCOUNT1_KEY, &ids[1], "shared").await;
    assert_eq!((admin.status, other.status), (200, 200));
    assert!(!other.replayed);
    assert_ne!(admin.body, other.body);
    for id in &ids {
        assert_eq!(token_status(&app, id).await, "redeemed");
    }
    for key_id in ["admin", "acct1"] {
        let records = key_records(&app, key_id).await;
        assert_eq!(records.len(), 1, "{key_id}");
        assert_eq!(records[0].get_str("key").unwrap(), "shared");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_with_one_key_run_once() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_concurrent", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    let answers = join_all((0..16).map(|_| async {
        seen(post(&app, ADMIN_KEY, &path, Some("together"), None, None).await).await
    }))
    .await;
    // Without the key, all but one would be 409 state_conflict; with it exactly one
    // runs, and each other is its replay or told the first is still running.
    let ran = the_one_that_ran(&answers);
    assert_eq!(token_version(&app, &id).await, Some(1), "redeemed once");
    let retry = seen(post(&app, ADMIN_KEY, &path, Some("together"), None, None).await).await;
    assert!(retry.replayed);
    assert_eq!(retry.body, ran.body);
}

/// A record held by an attempt whose lease is running answers 409 with `Retry-After`;
/// one whose lease ended (its instance died mid-request) is taken over by the retry,
/// which runs the action.
#[tokio::test]
async fn a_running_key_is_held_until_its_lease_ends() {
    let app = spawn_app().await;
    let ids = app.issue_tokens("pi_key_lease", 2).await;
    let now = DateTime::now().timestamp_millis();
    for (id, key, lease_until) in [
        (&ids[0], "running", now + 60_000),
        (&ids[1], "abandoned", now - 1),
    ] {
        let path = format!("/v1/tokens/{id}/redeem");
        let lease_until = DateTime::from_millis(lease_until);
        insert_unanswered_record(&app, key, &path, b"", lease_until).await;
    }
    let running = post(
        &app,
        ADMIN_KEY,
        &format!("/v1/tokens/{}/redeem", ids[0]),
        Some("running"),
        None,
        None,
    )
    .await;
    assert_eq!(running.headers()["retry-after"], "1");
    assert_problem(running, 409, "request_in_progress").await;
    assert_eq!(token_status(&app, &ids[0]).await, "active");

    let taken_over = redeem_keyed(&app, ADMIN_KEY, &ids[1], "abandoned").await;
    assert_eq!((taken_over.status, taken_over.replayed), (200, false));
    assert_eq!(token_status(&app, &ids[1]).await, "redeemed");
    let record = app
        .find_stored("idempotency_keys", doc! { "key": "abandoned" })
        .await;
    assert_eq!(
        record
            .get_document("answer")
            .unwrap()
            .get_i32("status")
            .unwrap(),
        200
    );
}

#[tokio::test]
async fn a_malformed_key_is_refused_naming_the_header_and_writes_nothing() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_malformed", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    for bad in [String::new(), "k".repeat(256), "two words".to_owned()] {
        let response = post(&app, ADMIN_KEY, &path, Some(&bad), None, None).await;
        let problem = assert_problem(response, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["field"], "Idempotency-Key", "{bad:?}");
    }
    assert_eq!(token_status(&app, &id).await, "active");
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0);
}

#[tokio::test]
async fn the_caller_is_refused_before_a_malformed_key() {
    // No credentials: 401; a key without the scope: 403; only then the header's 422.
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_caller_first", 1).await.remove(0);
    let redemption =
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": 1, "reference": "r" });
    let transfer = json!({ "newOwner": OTHER_OWNER });
    let routes = [
        (format!("/v1/tokens/{id}/redeem"), None),
        (format!("/v1/tokens/{id}/revoke"), None),
        (format!("/v1/tokens/{id}/transfer"), Some(&transfer)),
        ("/v1/redemptions".to_owned(), Some(&redemption)),
    ];
    for (path, body) in routes {
        let send = |key: Option<&str>| {
            let mut request = app
                .http
                .post(app.url(&path))
                .header("idempotency-key", "two words")
                .header("if-match", "\"0\"");
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            request.send()
        };
        let anonymous = send(None).await.unwrap();
        assert_eq!(anonymous.status(), 401, "{path}");
        assert!(
            anonymous.headers().contains_key("www-authenticate"),
            "{path}"
        );
        assert_problem(send(Some(READER_KEY)).await.unwrap(), 403, "forbidden").await;
        let problem = assert_problem(
            send(Some(ADMIN_KEY)).await.unwrap(),
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(problem["errors"][0]["field"], "Idempotency-Key", "{path}");
    }
    // A well-formed key with a body over the limit: the caller first, then 413.
    let path = format!("/v1/tokens/{id}/redeem");
    let oversized = json!({ "reference": "x".repeat(70_000) });
    let send = |key: &str| {
        app.http
            .post(app.url(&path))
            .bearer_auth(key)
            .header("idempotency-key", "big-body")
            .json(&oversized)
            .send()
    };
    assert_problem(send(READER_KEY).await.unwrap(), 403, "forbidden").await;
    assert_problem(send(ADMIN_KEY).await.unwrap(), 413, "payload_too_large").await;
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0);
    // A key without the scope is refused before its Idempotency-Key is looked at: a
    // record another request of that key left running says nothing to it.
    app.db
        .collection::<mongodb::bson::Document>("idempotency_keys")
        .insert_one(doc! {
            "keyId": "reader", "key": "held", "method": "POST", "path": &path,
            "bodySha256": "", "attempt": mongodb::bson::oid::ObjectId::new(),
            "leaseUntil": DateTime::from_millis(i64::MAX / 2), "createdAt": DateTime::now(),
            "expiresAt": DateTime::from_millis(i64::MAX / 2),
        })
        .await
        .unwrap();
    let held = app
        .http
        .post(app.url(&path))
        .bearer_auth(READER_KEY)
        .header("idempotency-key", "held")
        .send()
        .await
        .unwrap();
    assert_problem(held, 403, "forbidden").await;
    app.db
        .collection::<mongodb::bson::Document>("idempotency_keys")
        .delete_many(doc! {})
        .await
        .unwrap();
    assert_eq!(token_status(&app, &id).await, "active");
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0);
    assert_eq!(app.count("redemptions", doc! {}).await, 0);
}

#[tokio::test]
async fn the_key_indexes_come_from_the_migrations() {
    let app = spawn_app().await;
    let indexes: Vec<mongodb::bson::Document> = {
        use futures::TryStreamExt;
        app.db
            .collection::<mongodb::bson::Document>("idempotency_keys")
            .list_indexes()
            .await
            .unwrap()
            .map_ok(|model| mongodb::bson::to_document(&model).unwrap())
            .try_collect()
            .await
            .unwrap()
    };
    let named = |name: &str| {
        indexes
            .iter()
            .find(|i| i.get_str("name").ok() == Some(name))
            .unwrap_or_else(|| panic!("no index {name}: {indexes:?}"))
            .clone()
    };
    let unique = named("uniq_idempotency_key");
    assert_eq!(
        unique.get_document("key").unwrap(),
        &doc! { "keyId": 1, "key": 1 }
    );
    assert_eq!(unique.get_bool("unique"), Ok(true));
    let ttl = named("idempotency_keys_expiry");
    assert_eq!(ttl.get_document("key").unwrap(), &doc! { "expiresAt": 1 });
    assert_eq!(ttl.get_i32("expireAfterSeconds"), Ok(0));
}

#[tokio::test]
async fn another_instance_answers_the_retry() {
    let first = spawn_app().await;
    let second = spawn_app_on(&first.db_name, "").await;
    let id = first.issue_tokens("pi_key_instances", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    let answered =
        seen(post(&first, ADMIN_KEY, &path, Some("two-instances"), None, None).await).await;
    assert_eq!((answered.status, answered.replayed), (200, false));
    // The retry reaches the other instance, which has never seen the request: the record
    // in MongoDB answers it.
    let retried =
        seen(post(&second, ADMIN_KEY, &path, Some("two-instances"), None, None).await).await;
    assert!(retried.replayed);
    assert_eq!(
        (retried.status, &retried.body),
        (answered.status, &answered.body)
    );
    assert_eq!(token_version(&first, &id).await, Some(1));
}

#[tokio::test]
async fn a_5xx_is_not_kept_and_the_retry_runs_again() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_key_5xx", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    // The redeem's write fails with an error that is no outage: 500, nothing written.
    let failpoint = FailPoint::set(&name, &["findAndModify"], Fault::error(2), 1).await;
    let failed = post(&app, ADMIN_KEY, &path, Some("after-5xx"), None, None).await;
    assert_problem(failed, 500, "internal_error").await;
    assert!(
        failpoint
            .fired_within(1, std::time::Duration::from_secs(5))
            .await
    );
    drop(failpoint);
    assert_eq!(
        app.count("idempotency_keys", doc! {}).await,
        0,
        "the key was released"
    );
    assert_eq!(token_status(&app, &id).await, "active");

    let retried = seen(post(&app, ADMIN_KEY, &path, Some("after-5xx"), None, None).await).await;
    assert_eq!(
        (retried.status, retried.replayed),
        (200, false),
        "the retry ran"
    );
    assert_eq!(token_status(&app, &id).await, "redeemed");
}

/// A refusal of the request itself (here 428: a transfer without `If-Match`) is not kept:
/// the action never ran, so the corrected request with the same key runs, once.
#[tokio::test]
async fn a_request_refused_before_its_action_leaves_the_key_for_the_corrected_one() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_428", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/transfer");
    let body = json!({ "newOwner": OTHER_OWNER });
    let refused = post(&app, ADMIN_KEY, &path, Some("fix-me"), None, Some(&body)).await;
    assert_eq!(refused.status(), 428);
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0, "released");
    assert_eq!(token_version(&app, &id).await, Some(0));

    let corrected = transfer_keyed(&app, &id, "fix-me").await;
    assert_eq!((corrected.status, corrected.replayed), (200, false));
    let retried = transfer_keyed(&app, &id, "fix-me").await;
    assert_eq!((retried.status, retried.replayed), (200, true));
    assert_eq!(retried.body, corrected.body);
    assert_transferred_once(&app, &id, "the corrected request").await;
}

/// A refusal of the request itself (a bad body) whose release failed (the database
/// refused the delete) leaves its key's record unanswered: while that attempt's lease
/// runs, the corrected body is the key's reuse (422); once it is over, nothing of the refused
/// request happened (an action commits with its answer), so the corrected request takes
/// the key, runs once, and its retry replays it.
#[tokio::test]
async fn a_refused_request_whose_release_failed_leaves_the_key_to_the_corrected_one_after_its_lease()
 {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "[server]\nrequest_timeout_ms = 1500\n").await;
    let id = app.issue_tokens("pi_key_lost_release", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/transfer");
    let bad = json!({ "newOwner": "not-an-owner" });
    let keys = format!("{}.idempotency_keys", app.db_name);
    // The release, the second findAndModify on the keys (the claim is the first).
    let failing =
        FailPoint::after_first_on(&name, &["findAndModify"], &keys, Fault::error(2)).await;
    let refused = post(
        &app,
        ADMIN_KEY,
        &path,
        Some("fix-me"),
        Some("\"0\""),
        Some(&bad),
    )
    .await;
    assert_eq!(refused.status(), 422);
    assert_eq!(failing.off().await, 1, "the release was never refused");
    assert_eq!(
        app.count("idempotency_keys", doc! {}).await,
        1,
        "not released"
    );

    let early = transfer_keyed(&app, &id, "fix-me").await;
    assert_eq!(early.status, 422, "the refused attempt's lease still runs");
    assert!(String::from_utf8_lossy(&early.body).contains("idempotency_key_reused"));
    assert_eq!(token_version(&app, &id).await, Some(0));

    // The lease over, the corrected request sent several times at once: one takes the
    // key and runs; the others, copies of it, hear that it runs or replay it, never 422.
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    let copies = join_all((0..8).map(|_| transfer_keyed(&app, &id, "fix-me"))).await;
    let ran = the_one_that_ran(&copies);
    let retried = transfer_keyed(&app, &id, "fix-me").await;
    assert_eq!((retried.status, retried.replayed), (200, true));
    assert_eq!(retried.body, ran.body);
    assert_transferred_once(&app, &id, "the corrected request").await;
    // Kept the retention from when the corrected request took the key.
    let record = app
        .find_stored("idempotency_keys", doc! { "key": "fix-me" })
        .await;
    let left = record.get_datetime("expiresAt").unwrap().timestamp_millis()
        - DateTime::now().timestamp_millis();
    assert!(left > 23 * 3_600_000, "{record}");
}

/// A 412 naming a version the token has not reached yet (the client saw a later one than
/// the token shows, as a new primary may show for a moment) is not kept: once the token
/// reaches that version, the same request with the same key runs. A 412 naming an older
/// version is what happened to that request: kept, and replayed.
#[tokio::test]
async fn a_412_for_a_version_not_reached_yet_is_not_kept_and_one_for_an_older_is() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_412", 1).await.remove(0);
    let revoke = format!("/v1/tokens/{id}/revoke");
    // Revokes the token with `If-Match: "version"` under the key `key`.
    let revoke_with = |key: &'static str, version: i64| {
        let (app, revoke) = (&app, &revoke);
        async move {
            let tag = format!("\"{version}\"");
            seen(post(app, ADMIN_KEY, revoke, Some(key), Some(&tag), None).await).await
        }
    };
    let ahead = revoke_with("ahead", 1).await;
    assert_eq!(ahead.status, 412);
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0, "released");
    assert_eq!(token_version(&app, &id).await, Some(0));

    // The token reaches version 1 (moved to another owner); the same request now runs.
    let transfer = format!("/v1/tokens/{id}/transfer");
    let body = json!({ "newOwner": OTHER_OWNER });
    let moved = post(&app, ADMIN_KEY, &transfer, None, Some("\"0\""), Some(&body)).await;
    assert_eq!(moved.status(), 200);
    let ran = revoke_with("ahead", 1).await;
    assert_eq!((ran.status, ran.replayed), (200, false));
    assert_eq!(token_status(&app, &id).await, "revoked");

    // An older version: stale for good, kept and replayed. (A redeem: a revoke under an
    // older tag finds its change made, and is answered 200.)
    let redeem = format!("/v1/tokens/{id}/redeem");
    let redeem_behind = || async {
        seen(
            post(
                &app,
                ADMIN_KEY,
                &redeem,
                Some("behind"),
                Some("\"0\""),
                None,
            )
            .await,
        )
        .await
    };
    let stale = redeem_behind().await;
    assert_eq!((stale.status, stale.replayed), (412, false));
    let again = redeem_behind().await;
    assert_eq!((again.status, again.replayed), (412, true));
    assert_eq!(again.body, stale.body);

    // A list naming a version ahead is not kept either: once the token reaches it (moved
    // away and back), the same request runs.
    let listed = app.issue_tokens("pi_key_412_list", 1).await.remove(0);
    let transfer = format!("/v1/tokens/{listed}/transfer");
    let to = |owner: &str| json!({ "newOwner": owner });
    let away = to(OTHER_OWNER);
    let ahead_list = || {
        post(
            &app,
            ADMIN_KEY,
            &transfer,
            Some("ahead-list"),
            Some("\"2\", \"3\""),
            Some(&away),
        )
    };
    let refused = seen(ahead_list().await).await;
    assert_eq!((refused.status, refused.replayed), (412, false));
    for (owner, tag) in [(OTHER_OWNER, "\"0\""), (OWNER, "\"1\"")] {
        let moved = post(
            &app,
            ADMIN_KEY,
            &transfer,
            None,
            Some(tag),
            Some(&to(owner)),
        )
        .await;
        assert_eq!(moved.status(), 200);
    }
    let ran = seen(ahead_list().await).await;
    assert_eq!((ran.status, ran.replayed), (200, false));

    // A key that may not read tokens has every 412 kept: were a version ahead released,
    // its retries would tell it the token's version.
    let other = app.issue_tokens("pi_key_412_gate", 1).await.remove(0);
    let redeem = format!("/v1/tokens/{other}/redeem");
    let gate = |tag| post(&app, REDEEMER_KEY, &redeem, Some("gate"), Some(tag), None);
    let first = seen(gate("\"7\"").await).await;
    assert_eq!((first.status, first.replayed), (412, false));
    let retried = seen(gate("\"7\"").await).await;
    assert_eq!((retried.status, retried.replayed), (412, true));
}

/// A key is any visible ASCII, `$` first included: it is stored as written (never read as
/// a field path by the claim's pipeline), and its retry replays.
#[tokio::test]
async fn a_key_that_looks_like_an_operator_is_stored_as_written() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_dollar", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    let first = seen(post(&app, ADMIN_KEY, &path, Some("$path"), None, None).await).await;
    assert_eq!((first.status, first.replayed), (200, false));
    let retry = seen(post(&app, ADMIN_KEY, &path, Some("$path"), None, None).await).await;
    assert_eq!(
        (retry.status, retry.replayed, &retry.body),
        (200, true, &first.body)
    );
    // Another request with a key that would name a variable is its own record.
    let other = app.issue_tokens("pi_key_dollar_2", 1).await.remove(0);
    let other_path = format!("/v1/tokens/{other}/redeem");
    let second = seen(post(&app, ADMIN_KEY, &other_path, Some("$$NOW"), None, None).await).await;
    assert_eq!((second.status, second.replayed), (200, false));
    let records = key_records(&app, "admin").await;
    let mut keys: Vec<&str> = records.iter().map(|r| r.get_str("key").unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["$$NOW", "$path"]);
    let stored = app
        .find_stored("idempotency_keys", doc! { "key": "$path" })
        .await;
    assert_eq!(stored.get_str("path").unwrap(), path);
}

/// A 404 is not kept: nothing was done, and the token may be there for the retry. A
/// read behind a failover (a new primary's majority that does not have a token a 201
/// named yet) answers 404 for a token that exists; kept, every retry with the key would
/// answer 404 for a day. Here the token is taken out of the database for the first
/// attempt and put back before the retry, which redeems it.
#[tokio::test]
async fn a_404_is_not_kept_and_the_retry_finds_the_token() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_key_404", 1).await.remove(0);
    let stored = app.stored_token(&id).await;
    let tokens = app.db.collection::<mongodb::bson::Document>("tokens");
    tokens
        .delete_one(doc! { "_id": stored.get("_id").unwrap().clone() })
        .await
        .unwrap();

    let first = redeem_keyed(&app, ADMIN_KEY, &id, "found-later").await;
    assert_eq!(first.status, 404);
    assert_eq!(app.count("idempotency_keys", doc! {}).await, 0, "not kept");

    tokens.insert_one(&stored).await.unwrap();
    let retry = redeem_keyed(&app, ADMIN_KEY, &id, "found-later").await;
    assert_eq!((retry.status, retry.replayed), (200, false));
    assert_eq!(token_status(&app, &id).await, "redeemed");
    let again = redeem_keyed(&app, ADMIN_KEY, &id, "found-later").await;
    assert_eq!((again.status, again.replayed), (200, true));
    assert_eq!(again.body, retry.body);

    // A token of an account the key may not see is 404 as well, and not kept either:
    // the key is free for the key's own token.
    let mut other = issuance_body("pi_key_404_theirs", 1);
    other["accountId"] = json!("acct_2");
    let theirs = token_ids(&json(app.issue(ADMIN_KEY, &other).await).await).remove(0);
    let hidden = redeem_keyed(&app, ACCOUNT1_KEY, &theirs, "scoped").await;
    assert_eq!(hidden.status, 404);
    assert_eq!(key_records(&app, "acct1").await.len(), 0, "not kept");
    assert_eq!(token_status(&app, &theirs).await, "active");
    let mine = app.issue_tokens("pi_key_404_mine", 1).await.remove(0);
    let own = redeem_keyed(&app, ACCOUNT1_KEY, &mine, "scoped").await;
    assert_eq!((own.status, own.replayed), (200, false));
}
