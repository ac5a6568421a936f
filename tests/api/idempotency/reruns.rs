//! An attempt whose answer was lost, made to happen with MongoDB's own faults: the answer
//! write fails, the commit is reported failed although it applied, the lease is taken
//! over while the action runs. Whatever happened, a retry with the key is answered as the
//! action's one commit was, and the token or the redemption changed exactly once.

use std::time::Duration;

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use serde_json::json;

use super::{
    assert_transferred_once, insert_unanswered_record, key_records, post, post_redemption, seen,
    send_transfer, the_one_that_ran, token_status, token_version, transfer_keyed,
};
use crate::helpers::*;

/// The write concern error a commit answers after it applied (WriteConcernFailed: the
/// majority did not confirm it within `wtimeoutMS`). The service answers it 503
/// `database_unavailable`: the retry is the cure, not a report.
const APPLIED_BUT_FAILED: Fault = Fault::WriteConcernError { code: 64 };

/// The answer write fails inside the action's transaction: the transfer is undone with
/// it (500, nothing moved, the key released), and the retry transfers once.
#[tokio::test]
async fn a_failed_answer_write_undoes_the_action_and_the_retry_runs_it_once() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_rerun_answer", 1).await.remove(0);
    // The record's answer is the flow's only `update` (the claim and the token's write
    // are findAndModify).
    let failpoint = FailPoint::set(&name, &["update"], Fault::error(2), 1).await;
    let failed = send_transfer(&app, &id, "k").await;
    assert_problem(failed, 500, "internal_error").await;
    assert_eq!(failpoint.off().await, 1, "the answer write failed");
    let token = app.stored_token(&id).await;
    assert_eq!(
        stored_int(&token, "_version"),
        Some(0),
        "undone with its answer"
    );
    assert_eq!(token.get_object_id("owner").unwrap().to_hex(), OWNER);
    assert!(key_records(&app, "admin").await.is_empty(), "released");

    let first = transfer_keyed(&app, &id, "k").await;
    assert_eq!((first.status, first.replayed), (200, false));
    let retry = transfer_keyed(&app, &id, "k").await;
    assert!(retry.replayed);
    assert_eq!((retry.status, &retry.body), (first.status, &first.body));
    assert_transferred_once(&app, &id, "run by the retry").await;
}

/// An unanswered record of `key` for [`send_transfer`]'s request on token `id`, held by
/// another attempt whose lease ends `lease_ms` from now (in the past when negative).
async fn insert_transfer_record(app: &TestApp, id: &str, key: &str, lease_ms: i64) {
    let path = format!("/v1/tokens/{id}/transfer");
    let body = serde_json::to_vec(&json!({ "newOwner": OTHER_OWNER })).unwrap();
    let lease_until = DateTime::from_millis(DateTime::now().timestamp_millis() + lease_ms);
    insert_unanswered_record(app, key, &path, &body, lease_until).await;
}

/// Waits (at most 5 s) until no record holds the admin key's keys, a failed attempt's
/// having been taken back; then the transfer of `id` with `key` runs, once.
async fn the_retry_runs_once_the_key_is_free(app: &TestApp, id: &str, key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !key_records(app, "admin").await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the unconfirmed write still holds the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = transfer_keyed(app, id, key).await;
    assert_eq!((retry.status, retry.replayed), (200, false));
    assert_transferred_once(app, id, "run by the retry").await;
}

/// Sends the keyed transfer while `failpoint` is armed: it answers 503, the failpoint
/// was entered `times` times (`what` names the write), and the token is untouched.
async fn a_failed_transfer_ran_nothing(
    app: &TestApp,
    id: &str,
    key: &str,
    failpoint: FailPoint,
    times: i64,
    what: &str,
) {
    let failed = send_transfer(app, id, key).await;
    assert_problem(failed, 503, "database_unavailable").await;
    assert_eq!(failpoint.off().await, times, "{what} failed");
    assert_eq!(token_version(app, id).await, Some(0), "nothing ran");
}

/// The key's claim applies but answers a write concern error (the majority's timeout, or
/// a router that lost the shard's answer): the attempt answers 503 and takes its
/// unconfirmed claim back, so the key's retry runs the action at once instead of hearing
/// 409 `request_in_progress` until the claim's lease ends.
#[tokio::test]
async fn a_claim_that_applied_but_failed_is_taken_back_for_the_retry() {
    // 64: WriteConcernFailed (wtimeout), once. 89: NetworkTimeout, from a router, which
    // the driver retries itself (a retryable write's error label), so on both sends.
    for (code, times) in [(64, 1), (89, 2)] {
        let name = unique_app_name();
        let app = spawn_app_named(&name, "").await;
        let id = app.issue_tokens("pi_rerun_claim", 1).await.remove(0);
        // The claim is the flow's first findAndModify (the token's write is the second).
        let fault = Fault::WriteConcernError { code };
        let failpoint = FailPoint::set(&name, &["findAndModify"], fault, times).await;
        let what = format!("the claim, code {code},");
        a_failed_transfer_ran_nothing(&app, &id, "claim", failpoint, times, &what).await;
        the_retry_runs_once_the_key_is_free(&app, &id, "claim").await;
    }
}

/// The claim of a key whose record another attempt holds (its lease running) answers a
/// write concern error: the record, which the claim left as it was, is not this attempt's
/// to take back, and stays the other attempt's.
#[tokio::test]
async fn a_failed_claim_never_takes_back_another_attempts_record() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_rerun_claim_other", 1).await.remove(0);
    insert_transfer_record(&app, &id, "held", 60_000).await;
    let holder = key_records(&app, "admin").await[0]
        .get_object_id("attempt")
        .unwrap();
    let failpoint = FailPoint::set(&name, &["findAndModify"], APPLIED_BUT_FAILED, 1).await;
    a_failed_transfer_ran_nothing(&app, &id, "held", failpoint, 1, "the claim").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let records = key_records(&app, "admin").await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].get_object_id("attempt").unwrap(), holder);
}

/// A take-over of a key whose holder's lease ended applies but answers a write concern
/// error: the record now names an attempt that never ran, and is taken back like a
/// fresh claim, so the key's retry runs the action at once.
#[tokio::test]
async fn a_take_over_that_applied_but_failed_is_taken_back_for_the_retry() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_rerun_take_over", 1).await.remove(0);
    insert_transfer_record(&app, &id, "over", -1_000).await;
    // The claim (the first findAndModify) finds the record; the take-over fails. So may
    // the take-back after it (a findAndModify too, sent in the background), which
    // applies all the same.
    let failpoint = FailPoint::after_first(&name, &["findAndModify"], APPLIED_BUT_FAILED).await;
    let failed = send_transfer(&app, &id, "over").await;
    assert_problem(failed, 503, "database_unavailable").await;
    let fired = failpoint.off().await;
    assert!((1..=2).contains(&fired), "the take-over failed: {fired}");
    assert_eq!(token_version(&app, &id).await, Some(0), "nothing ran");
    the_retry_runs_once_the_key_is_free(&app, &id, "over").await;
}

/// A take-over of a key whose holder's lease ended applies, but its time limit (1 s, for
/// a record a transaction holds) runs out while it waits for the majority (the write
/// concern error `MaxTimeMSExpired`): the take-over goes on waiting for the majority
/// rather than answer 503, and the action runs once, in this attempt.
#[tokio::test]
async fn a_take_over_out_of_time_waiting_for_the_majority_runs_the_action() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app
        .issue_tokens("pi_rerun_take_over_late", 1)
        .await
        .remove(0);
    insert_transfer_record(&app, &id, "late", -1_000).await;
    // The claim (the record's first findAndModify) finds the record; the take-over, the
    // second, runs out of time.
    let records = format!("{}.idempotency_keys", app.db_name);
    let out_of_time = Fault::WriteConcernError { code: 50 };
    let failpoint =
        FailPoint::after_first_on(&name, &["findAndModify"], &records, out_of_time).await;
    let first = transfer_keyed(&app, &id, "late").await;
    assert_eq!(failpoint.off().await, 1, "the take-over ran out of time");
    assert_eq!((first.status, first.replayed), (200, false), "{first:?}");
    assert_transferred_once(&app, &id, "run by the attempt that took the key over").await;
    let retry = transfer_keyed(&app, &id, "late").await;
    assert!(retry.replayed);
    assert_eq!((retry.status, &retry.body), (first.status, &first.body));
}

/// The commit applies but answers an error, so the first attempt answers 5xx: its
/// answer committed with the action, and every retry — `If-Match: *` and an exact one
/// alike, which a re-run would re-apply or refuse with 412 — gets it.
#[tokio::test]
async fn a_commit_that_applied_but_failed_is_answered_as_committed() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let ids = app.issue_tokens("pi_rerun_commit", 3).await;
    let transfer = json!({ "newOwner": OTHER_OWNER });
    let revoke = json!({ "reason": "fraud" });
    let cases = [
        ("transfer", &ids[0], "*", Some(&transfer)),
        ("transfer", &ids[1], "\"0\"", Some(&transfer)),
        ("revoke", &ids[2], "\"0\"", Some(&revoke)),
    ];
    for (operation, id, if_match, body) in cases {
        let path = format!("/v1/tokens/{id}/{operation}");
        let key = format!("commit-{id}");
        let failpoint = FailPoint::always(&name, &["commitTransaction"], APPLIED_BUT_FAILED).await;
        let failed = post(&app, ADMIN_KEY, &path, Some(&key), Some(if_match), body).await;
        assert!(failpoint.off().await >= 1, "{operation}: the commit failed");
        let problem = assert_problem(failed, 503, "database_unavailable").await;
        assert!(
            !problem.to_string().contains("failpoint"),
            "no driver text: {problem}"
        );
        let committed = app.stored_token(id).await;
        assert_eq!(stored_int(&committed, "_version"), Some(1), "{operation}");

        for _ in 0..2 {
            let retry =
                seen(post(&app, ADMIN_KEY, &path, Some(&key), Some(if_match), body).await).await;
            assert_eq!((retry.status, retry.replayed), (200, true), "{operation}");
            assert_eq!(retry.etag.as_deref(), Some("\"1\""), "{operation}");
            let shown: serde_json::Value = serde_json::from_slice(&retry.body).unwrap();
            assert_eq!(shown["version"], 1, "{operation}: the committed change");
            assert_eq!(shown["id"], id.as_str());
        }
        assert_eq!(app.stored_token(id).await, committed, "{operation}: once");
    }
    let transferred = app.stored_token(&ids[0]).await;
    assert_eq!(
        transferred.get_object_id("owner").unwrap().to_hex(),
        OTHER_OWNER
    );
    assert_eq!(
        app.stored_token(&ids[2]).await.get_str("status").unwrap(),
        "revoked"
    );
}

/// A redemption whose commit applied but failed: the retry with the key answers 201 and
/// the committed tokens; the same request without the key replays it by its reference
/// (200, the same tokens); two tokens were redeemed, once.
#[tokio::test]
async fn a_redemption_whose_answer_was_lost_is_answered_201_with_its_tokens() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    app.issue_tokens("pi_rerun_redemption", 3).await;
    let body = json!({
        "owner": OWNER, "tokenType": "standard", "quantity": 2, "reference": "order-lost",
    });
    let failpoint = FailPoint::always(&name, &["commitTransaction"], APPLIED_BUT_FAILED).await;
    let failed = post_redemption(&app, Some("spend"), &body).await;
    assert!(failpoint.off().await >= 1, "the commit failed");
    assert_problem(failed, 503, "database_unavailable").await;
    let record = app
        .find_stored("redemptions", doc! { "reference": "order-lost" })
        .await;
    let committed: Vec<String> = record
        .get_array("tokenIds")
        .unwrap()
        .iter()
        .map(|id| id.as_object_id().unwrap().to_hex())
        .collect();
    assert_eq!(committed.len(), 2);

    let retry = post_redemption(&app, Some("spend"), &body).await;
    assert_eq!(retry.status(), 201, "the first attempt's status");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        retry.headers()["location"],
        "/v1/redemptions/65f1a0c2b3d4e5f601234567/order-lost"
    );
    let keyed: serde_json::Value = retry.json().await.unwrap();
    let by_reference = post_redemption(&app, None, &body).await;
    assert_eq!(by_reference.status(), 200, "a replay by reference");
    assert_eq!(by_reference.headers()["idempotent-replayed"], "true");
    let by_reference: serde_json::Value = by_reference.json().await.unwrap();
    for answer in [&keyed, &by_reference] {
        assert_eq!(token_ids(answer), committed, "{answer}");
    }
    assert_eq!(keyed, by_reference, "one body, the same tokens");
    assert_eq!(app.count("redemptions", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! { "status": "redeemed" }).await, 2);
    assert_eq!(app.count("tokens", doc! { "status": "active" }).await, 1);
}

/// The first attempt's lease ends while its write is held up, and the key is taken over
/// (here by hand, as a retry on another instance would): the first attempt's
/// transaction finds the record another attempt's and aborts, so its transfer never
/// commits; the attempt that took over transfers once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_key_was_taken_over_writes_nothing() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let id = app.issue_tokens("pi_rerun_take_over", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/transfer");
    let body = json!({ "newOwner": OTHER_OWNER });
    // The claim is the first findAndModify; the token's write, the second, is held up
    // long enough for the take-over below (one update) to come first.
    let held =
        FailPoint::after_first(&name, &["findAndModify"], Fault::Block { millis: 5_000 }).await;
    let first = {
        let (url, body) = (app.url(&path), body.clone());
        let http = app.http.clone();
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(ADMIN_KEY)
                .header("idempotency-key", "held")
                .header("if-match", "\"0\"")
                .json(&body)
                .send()
                .await
                .expect("request sent")
        })
    };
    assert!(
        held.fired_within(1, Duration::from_secs(20)).await,
        "the transfer's write was held up"
    );
    let taken_over = app
        .db
        .collection::<Document>("idempotency_keys")
        .update_one(
            doc! { "keyId": "admin", "key": "held" },
            doc! { "$set": { "attempt": ObjectId::new(), "leaseUntil": DateTime::from_millis(0) } },
        )
        .await
        .unwrap();
    assert_eq!(taken_over.modified_count, 1);
    held.off().await;

    let first = first.await.unwrap();
    assert_problem(first, 409, "request_in_progress").await;
    assert_eq!(token_version(&app, &id).await, Some(0), "nothing committed");

    let retry = transfer_keyed(&app, &id, "held").await;
    assert_eq!(
        (retry.status, retry.replayed),
        (200, false),
        "the take-over runs"
    );
    let again = transfer_keyed(&app, &id, "held").await;
    assert_eq!(
        (again.status, again.replayed, &again.body),
        (200, true, &retry.body)
    );
    assert_transferred_once(&app, &id, "run by the take-over").await;
}

/// Refusals the same request may pass later are not kept: a redemption of more tokens
/// than there are (until more are issued), and a token that kept changing (until it stops).
#[tokio::test]
async fn refusals_a_retry_may_pass_release_the_key() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    app.issue_tokens("pi_rerun_short", 1).await;
    let body = json!({
        "owner": OWNER, "tokenType": "standard", "quantity": 2, "reference": "order-short",
    });
    let short = post_redemption(&app, Some("short"), &body).await;
    let problem = assert_problem(short, 409, "insufficient_balance").await;
    assert_eq!(problem["available"], 1);
    assert!(key_records(&app, "admin").await.is_empty(), "not kept");
    app.issue_tokens("pi_rerun_more", 1).await;
    let spent = post_redemption(&app, Some("short"), &body).await;
    assert_eq!(spent.status(), 201);
    assert_eq!(app.count("tokens", doc! { "status": "redeemed" }).await, 2);

    let id = app.issue_tokens("pi_rerun_contended", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    // Every write of the token conflicts (the key's claim and release do not).
    let conflicting = FailPoint::always_on(
        &name,
        &["findAndModify"],
        &format!("{}.tokens", app.db_name),
        Fault::Error {
            code: 112,
            labels: vec!["TransientTransactionError".to_owned()],
        },
    )
    .await;
    let contended = post(&app, ADMIN_KEY, &path, Some("busy"), None, None).await;
    assert!(conflicting.off().await >= 1);
    assert_problem(contended, 409, "state_conflict").await;
    assert_eq!(
        app.count("idempotency_keys", doc! { "key": "busy" }).await,
        0,
        "not kept"
    );
    assert_eq!(token_status(&app, &id).await, "active");
    let redeemed = seen(post(&app, ADMIN_KEY, &path, Some("busy"), None, None).await).await;
    assert_eq!((redeemed.status, redeemed.replayed), (200, false));
    assert_eq!(token_version(&app, &id).await, Some(1));
}

/// A record written by a transaction still open (one whose instance died before its
/// commit reached the server, which ends it only at `transactionLifetimeLimitSeconds`):
/// a retry is told the first attempt is in progress, in well under the request timeout,
/// instead of waiting on the transaction; once it ends, the retry takes the key over.
#[tokio::test]
async fn a_retry_does_not_wait_on_a_record_an_open_transaction_holds() {
    let app = spawn_app().await;
    let id = app.issue_tokens("pi_rerun_open", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/redeem");
    // An abandoned attempt's record: unanswered, its lease over…
    insert_unanswered_record(&app, "open", &path, b"", DateTime::from_millis(0)).await;
    // …written by a transaction that never ends on its own here.
    let mut session = app.db.client().start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    app.db
        .collection::<Document>("idempotency_keys")
        .update_one(
            doc! { "key": "open" },
            doc! { "$set": { "attempt": ObjectId::new() } },
        )
        .session(&mut session)
        .await
        .unwrap();

    let retry = post(&app, ADMIN_KEY, &path, Some("open"), None, None).await;
    assert_eq!(retry.headers()["retry-after"], "1");
    assert_problem(retry, 409, "request_in_progress").await;
    assert_eq!(token_status(&app, &id).await, "active");

    session.abort_transaction().await.unwrap();
    let taken_over = seen(post(&app, ADMIN_KEY, &path, Some("open"), None, None).await).await;
    assert_eq!((taken_over.status, taken_over.replayed), (200, false));
    assert_eq!(token_version(&app, &id).await, Some(1));
}

/// Releasing a key whose record an open transaction holds (an attempt that took the key
/// over and died mid-commit) gives up after a bounded wait, instead of holding its
/// request (and a pooled connection) until the server ends the transaction; the record
/// is left to its lease, and a release once the transaction ended deletes it.
#[tokio::test]
async fn a_release_does_not_wait_on_a_record_an_open_transaction_holds() {
    let app = spawn_app().await;
    insert_unanswered_record(&app, "held", "/v1/tokens/x/redeem", b"", DateTime::now()).await;
    let keys = app.db.collection::<Document>("idempotency_keys");
    let record = keys
        .find_one(doc! { "key": "held" })
        .await
        .unwrap()
        .unwrap();
    let id = record.get_object_id("_id").unwrap();
    let held = tokenmint::store::HeldRecord {
        key_id: "admin".to_owned(),
        key: "held".to_owned(),
        id,
        attempt: record.get_object_id("attempt").unwrap(),
    };
    let mut session = app.db.client().start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    keys.update_one(
        doc! { "_id": id },
        doc! { "$set": { "heldBy": "a transaction" } },
    )
    .session(&mut session)
    .await
    .unwrap();

    let store = connect_store(&mongo_uri(), &app.db_name).await;
    // Far longer than the release's own bound, far shorter than the transaction's life.
    let released = tokio::time::timeout(
        Duration::from_secs(20),
        store.release_idempotency_record(&held),
    )
    .await
    .expect("the release waited on the open transaction");
    assert!(
        released.is_err(),
        "a release that did not happen said it did"
    );
    assert_eq!(app.count("idempotency_keys", doc! { "_id": id }).await, 1);

    session.abort_transaction().await.unwrap();
    store.release_idempotency_record(&held).await.unwrap();
    assert_eq!(app.count("idempotency_keys", doc! { "_id": id }).await, 0);
}

/// Two instances retry an abandoned attempt's key at once (its lease over, no answer):
/// the take-over lets exactly one of them run; the other is told the key is in progress
/// or replays the winner's answer. Which one wins is not the point: that one ran, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_taking_over_one_key_run_the_action_once() {
    let first = spawn_app().await;
    let second = spawn_app_on(&first.db_name, "").await;
    let id = first.issue_tokens("pi_rerun_two", 1).await.remove(0);
    let path = format!("/v1/tokens/{id}/transfer");
    let body = json!({ "newOwner": OTHER_OWNER });
    let body_bytes = serde_json::to_vec(&body).unwrap();
    insert_unanswered_record(
        &first,
        "orphan",
        &path,
        &body_bytes,
        DateTime::from_millis(0),
    )
    .await;
    let send = |app: &TestApp| {
        let request = app
            .http
            .post(app.url(&path))
            .bearer_auth(ADMIN_KEY)
            .header("idempotency-key", "orphan")
            .header("if-match", "\"0\"")
            .body(body_bytes.clone())
            .header("content-type", "application/json")
            .send();
        async move { seen(request.await.unwrap()).await }
    };
    let answers =
        futures::future::join_all((0..8).map(|i| send(if i % 2 == 0 { &first } else { &second })))
            .await;
    let ran = the_one_that_ran(&answers);
    assert_transferred_once(&first, &id, "taken over by two instances").await;
    let replay = send(&second).await;
    assert_eq!(
        (replay.status, replay.replayed, &replay.body),
        (200, true, &ran.body)
    );
}

/// After the retention the key is new again (the TTL deletes its record; here by hand):
/// a redemption retried with it replays by its reference (200, the same tokens) and spends
/// nothing more.
#[tokio::test]
async fn a_redemption_retried_after_the_retention_spends_nothing_more() {
    let app = spawn_app().await;
    app.issue_tokens("pi_rerun_retention", 4).await;
    let body = json!({
        "owner": OWNER, "tokenType": "standard", "quantity": 2, "reference": "order-old",
    });
    let first = post_redemption(&app, Some("old"), &body).await;
    assert_eq!(first.status(), 201);
    let first: serde_json::Value = first.json().await.unwrap();
    app.db
        .collection::<Document>("idempotency_keys")
        .delete_many(doc! {})
        .await
        .unwrap();

    let late = post_redemption(&app, Some("old"), &body).await;
    assert_eq!(late.status(), 200, "a replay by reference");
    assert_eq!(late.headers()["idempotent-replayed"], "true");
    let late: serde_json::Value = late.json().await.unwrap();
    assert_eq!(late["tokens"], first["tokens"]);
    assert_eq!(app.count("tokens", doc! { "status": "redeemed" }).await, 2);
    assert_eq!(app.count("redemptions", doc! {}).await, 1);
}

/// The connection dies right after the action's write, at the answer's write or at the
/// commit: the transaction is run again (or its commit sent again) and answers once; the
/// token moved once, and the retry replays that answer.
#[tokio::test]
async fn a_connection_lost_after_the_action_still_moves_the_token_once() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let ids = app.issue_tokens("pi_rerun_cut", 2).await;
    for (id, command) in [(&ids[0], "update"), (&ids[1], "commitTransaction")] {
        let key = format!("cut-{command}");
        let failpoint = FailPoint::set(&name, &[command], Fault::CloseConnection, 1).await;
        let first = transfer_keyed(&app, id, &key).await;
        assert_eq!(
            failpoint.off().await,
            1,
            "{command}: the connection was cut"
        );
        assert_eq!((first.status, first.replayed), (200, false), "{command}");
        let retry = transfer_keyed(&app, id, &key).await;
        assert_eq!(
            (retry.status, retry.replayed, &retry.body),
            (200, true, &first.body)
        );
        assert_transferred_once(&app, id, command).await;
    }
}
