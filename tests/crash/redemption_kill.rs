//! A SIGKILL in the middle of a redemption by amount: its transaction has redeemed the
//! tokens and written the record, but its commit (and any abort) never reaches the server
//! (a failpoint closes the connection of both), and the process dies with the transaction
//! open. Nothing of it may be visible — no token redeemed, no record — and a retry after
//! the restart (once the server has reaped the abandoned transaction) redeems exactly the
//! tokens asked for, then replays the same ids. With an `Idempotency-Key`, the retry is
//! told `request_in_progress` while the abandoned transaction holds the key's record and
//! the dead attempt's lease runs, then runs once (201), and its retries answer that 201.

use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tokenmint_test_support::*;

/// The abandoned transaction keeps its locks until `transactionLifetimeLimitSeconds`; the
/// crash suite's mongod runs with a short one (see `retries.rs`).
const TRANSACTION_LIFETIME_SECS: i32 = 5;

async fn tokens_in(store: &tokenmint::store::Store, status: &str) -> u64 {
    store
        .database()
        .collection::<Document>("tokens")
        .count_documents(doc! { "status": status })
        .await
        .unwrap()
}

/// The answer's status, `Idempotent-Replayed`, and body.
async fn redeem(base: &str, body: &Value, key: Option<&str>) -> Option<(u16, bool, Value)> {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/redemptions"))
        .bearer_auth(SERVICE_KEY)
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    Some((status, replayed, response.json().await.ok()?))
}

/// Whether an answer says only "not yet": a 5xx, or the key's first attempt running.
fn not_yet(status: u16, answer: &Value) -> bool {
    status >= 500 || (status == 409 && answer["code"] == "request_in_progress")
}

/// The scenario, the redemption sent with the Idempotency-Key `key` when given.
pub(super) async fn scenario(key: Option<&str>) {
    let scratch = ScratchDatabase::create("crash_redemption").await;
    let store = scratch.store();
    mongodb::Client::with_uri_str(mongo_uri())
        .await
        .unwrap()
        .database("admin")
        .run_command(doc! { "setParameter": 1, "transactionLifetimeLimitSeconds": TRANSACTION_LIFETIME_SECS })
        .await
        .expect("setParameter transactionLifetimeLimitSeconds");

    let name = unique_app_name();
    let mut service = Service::start_named(scratch.name(), &name, &[]);
    let issued = reqwest::Client::new()
        .post(format!("{}/v1/issuances", service.base))
        .bearer_auth(SERVICE_KEY)
        .json(&json!({
            "provider": "stripe", "accountId": "acct_1", "paymentIntentId": "pi_redemption_kill",
            "owner": OWNER, "tokenType": "standard", "quantity": 5,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status(), 201);

    let body =
        json!({ "owner": OWNER, "tokenType": "standard", "quantity": 3, "reference": "kill-1" });
    let cut_off = FailPoint::always(
        &name,
        &["commitTransaction", "abortTransaction"],
        Fault::CloseConnection,
    )
    .await;
    let request = {
        let (base, body) = (service.base.clone(), body.clone());
        let key = key.map(str::to_owned);
        tokio::spawn(async move { redeem(&base, &body, key.as_deref()).await })
    };
    assert!(
        cut_off.fired_within(1, Duration::from_secs(20)).await,
        "the commit was never sent"
    );
    service.kill();
    // Answered 5xx just before the kill, or cut off by it: never a success.
    if let Some((status, _, answer)) = request.await.unwrap() {
        assert!(status >= 500, "{status}: {answer}");
    }
    cut_off.off().await;
    assert_eq!(
        tokens_in(store, "redeemed").await,
        0,
        "nothing of it is visible"
    );
    assert_eq!(tokens_in(store, "active").await, 5);
    let records = store
        .database()
        .collection::<Document>("redemptions")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(records, 0);

    // Restarted: the client retries until it gets an answer that is not a 5xx.
    let restarted = Service::start(scratch.name());
    let deadline = Instant::now() + Duration::from_secs(60);
    let (status, first) = loop {
        match redeem(&restarted.base, &body, key).await {
            Some((status, _, answer)) if !not_yet(status, &answer) => break (status, answer),
            other => {
                assert!(Instant::now() < deadline, "no answer but {other:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    assert_eq!(status, 201, "{first}");
    assert_eq!(token_ids(&first).len(), 3);
    // By reference: 200, the same ids.
    let (status, replayed, replay) = redeem(&restarted.base, &body, None)
        .await
        .expect("an answer");
    assert_eq!((status, replayed), (200, true), "{replay}");
    assert_eq!(token_ids(&replay), token_ids(&first));
    if key.is_some() {
        // With the key: the 201 that committed, its body exactly.
        let (status, replayed, replay) = redeem(&restarted.base, &body, key)
            .await
            .expect("an answer");
        assert_eq!((status, replayed), (201, true), "{replay}");
        assert_eq!(replay, first);
    }
    assert_eq!(tokens_in(store, "redeemed").await, 3);
    assert_eq!(tokens_in(store, "active").await, 2);
    let report = store.verify().await.expect("verify after the retry");
    assert!(report.is_clean(), "{report}");
    eprintln!(
        "crash[redemption-kill{}]: killed with the commit cut off: nothing visible; the retry redeemed 3, its replay named the same 3",
        if key.is_some() { ", keyed" } else { "" }
    );
}
