//! A redemption retried while its first attempt is applied on the primary but not yet
//! majority-committed (`failover_redemption_retried_before_the_majority_has_it_…`).
//!
//! The primary's committed snapshot is held back (`disableSnapshotting`, a test-only
//! failpoint): a write is applied, visible to a transaction's snapshot, and absent from
//! a majority read, as when the secondaries lag. The first attempt spends the owner's
//! only token of its type and gives up waiting for the majority; the retry, on another
//! instance, must answer neither 2xx (from data a failover may lose) nor 409
//! `insufficient_balance` (the token it finds spent is its own). Once the majority has
//! the first attempt, the retry replays it.

use std::time::Duration;

use mongodb::bson::{Document, doc};
use serde_json::json;
use tokenmint_test_support::{
    ADMIN_KEY, OWNER, indexed_token_ids, issuance_body, spawn_app_from, test_settings_at,
};

use super::replica_set::ReplicaSet;
use super::{ONE_AT_A_TIME, start_app};

pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[majority-lag]: starting a 3-member replica set");
    let set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let database = "tokenmint_failover_majority_lag";
    let app = start_app(&set, database).await;
    // The first attempt's instance gives up waiting for the majority after 2 s.
    let redeemer = spawn_app_from(&test_settings_at(
        &format!("{}&wtimeoutMS=2000", set.uri()),
        database,
        "[mongo]\nserver_selection_timeout_ms = 5000\n",
    ))
    .await;
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut stock = issuance_body("pi_majority_lag", 1);
    stock["tokenType"] = json!("lagonly");
    let stocked = http
        .post(format!("{}/v1/issuances", app.address))
        .bearer_auth(ADMIN_KEY)
        .json(&stock)
        .send()
        .await
        .unwrap();
    assert_eq!(stocked.status(), 201);
    let body = json!({
        "owner": OWNER, "tokenType": "lagonly", "quantity": 1, "reference": "majority-lag",
    });
    let redeem = |base: String| {
        let (http, body) = (http.clone(), body.clone());
        async move {
            let response = http
                .post(format!("{base}/v1/redemptions"))
                .bearer_auth(ADMIN_KEY)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.unwrap())
        }
    };

    let admin = set.clients()[primary].database("admin");
    let snapshotting = |mode: &'static str| {
        let admin = admin.clone();
        async move {
            admin
                .run_command(doc! { "configureFailPoint": "disableSnapshotting", "mode": mode })
                .await
                .expect("failpoint set");
        }
    };
    snapshotting("alwaysOn").await;
    let (first, first_body) = redeem(redeemer.address.clone()).await;
    eprintln!("failover[majority-lag] first attempt answered {first}: {first_body}");
    let (retry, retry_body) = redeem(app.address.clone()).await;
    eprintln!("failover[majority-lag] retry answered {retry}: {retry_body}");
    snapshotting("off").await;

    assert!(
        !(200..300).contains(&first),
        "the first attempt was answered {first} before the majority had it"
    );
    assert!(
        !(200..300).contains(&retry) && retry != 409,
        "the retry was answered {retry} while its first attempt was applied, not durable: {retry_body}"
    );
    // Once the majority has the first attempt, a retry replays it: the one token.
    let mut replayed = (0, json!(null));
    for _ in 0..20 {
        replayed = redeem(app.address.clone()).await;
        if replayed.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(replayed.0, 200, "{}", replayed.1);
    assert_eq!(indexed_token_ids(&replayed.1).len(), 1, "{}", replayed.1);
    let records = set.clients()[primary]
        .database(database)
        .collection::<Document>("redemptions")
        .count_documents(doc! { "reference": "majority-lag" })
        .await
        .unwrap();
    assert_eq!(records, 1);
    redeemer.stop().await;
    app.stop().await;
}
