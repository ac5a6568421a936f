//! A SIGKILL in the middle of a redemption by amount: its transaction has redeemed the
//! tokens and written the record, but its commit (and any abort) never reaches the server
//! (a failpoint closes the connection of both), and the process dies with the transaction
//! open. Nothing of it may be visible — no token redeemed, no record — and a retry after
//! the restart (once the server has reaped the abandoned transaction) redeems exactly the
//! tokens asked for, then replays the same ids.

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

async fn redeem(base: &str, body: &Value) -> Option<(u16, Value)> {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/redemptions"))
        .bearer_auth(SERVICE_KEY)
        .json(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.ok()?))
}

fn ids(answer: &Value) -> Vec<String> {
    answer["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) async fn scenario() {
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
    let uri = mongo_uri_named(&name);
    let mut service =
        Service::start_with(scratch.name(), &[("TOKENMINT__MONGO__URI", uri.as_str())]);
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
        tokio::spawn(async move { redeem(&base, &body).await })
    };
    assert!(
        cut_off.fired_within(1, Duration::from_secs(20)).await,
        "the commit was never sent"
    );
    service.kill();
    // Answered 5xx just before the kill, or cut off by it: never a success.
    if let Some((status, answer)) = request.await.unwrap() {
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
        match redeem(&restarted.base, &body).await {
            Some((status, answer)) if status < 500 => break (status, answer),
            other => {
                assert!(Instant::now() < deadline, "no answer but {other:?}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    assert_eq!(status, 201, "{first}");
    assert_eq!(ids(&first).len(), 3);
    let (status, replay) = redeem(&restarted.base, &body).await.expect("an answer");
    assert_eq!(status, 200, "{replay}");
    assert_eq!(ids(&replay), ids(&first));
    assert_eq!(tokens_in(store, "redeemed").await, 3);
    assert_eq!(tokens_in(store, "active").await, 2);
    eprintln!(
        "crash[redemption-kill]: killed with the commit cut off: nothing visible; the retry redeemed 3, its replay named the same 3"
    );
}
