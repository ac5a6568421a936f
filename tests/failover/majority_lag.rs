//! A redemption retried while its first attempt is applied on the primary but not yet
//! majority-committed (`failover_redemption_retried_before_the_majority_has_it_…`).
//!
//! The primary's committed snapshot is held back (`disableSnapshotting`, a test-only
//! failpoint): a write is applied, visible to a transaction's snapshot, and absent from
//! a majority read, as when the secondaries lag. The first attempt spends the owner's
//! only token of its type and gives up waiting for the majority; the retry, on another
//! instance, must answer neither 2xx (from data a failover may lose) nor 409
//! `insufficient_balance` (the token it finds spent is its own), but 503. Once the
//! majority has the first attempt, the retry replays it. Twice: with the owner's only
//! token of the type (nothing left to spend), and with two (another token it could
//! spend).

use std::time::Duration;

use mongodb::Database;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tokenmint_test_support::{ADMIN_KEY, OWNER, indexed_token_ids};

use super::load::stock_tokens;
use super::replica_set::ReplicaSet;
use super::{ONE_AT_A_TIME, start_app, start_impatient_app};

/// Turns the primary's `disableSnapshotting` failpoint to `mode`.
async fn snapshotting(admin: &Database, mode: &str) {
    admin
        .run_command(doc! { "configureFailPoint": "disableSnapshotting", "mode": mode })
        .await
        .expect("failpoint set");
}

pub(super) async fn scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[majority-lag]: starting a 3-member replica set");
    let set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let database = "tokenmint_failover_majority_lag";
    let app = start_app(&set, database).await;
    let redeemer = start_impatient_app(&set, database).await;
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let admin = set.clients()[primary].database("admin");
    let tokens = set.clients()[primary]
        .database(database)
        .collection::<Document>("tokens");
    // One token: nothing is left to spend (the retry must not refuse). Two: another one
    // is (the retry must not spend it).
    for (token_type, stocked) in [("lagone", 1), ("lagtwo", 2)] {
        let payment = format!("pi_majority_{token_type}");
        stock_tokens(&http, &app.address, &payment, token_type, stocked).await;
        let body = json!({
            "owner": OWNER, "tokenType": token_type, "quantity": 1, "reference": token_type,
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
                (status, response.json::<Value>().await.unwrap())
            }
        };

        snapshotting(&admin, "alwaysOn").await;
        let (first, first_body) = redeem(redeemer.address.clone()).await;
        eprintln!(
            "failover[majority-lag] {token_type}: first attempt answered {first}: {first_body}"
        );
        let (retry, retry_body) = redeem(app.address.clone()).await;
        eprintln!("failover[majority-lag] {token_type}: retry answered {retry}: {retry_body}");
        snapshotting(&admin, "off").await;

        assert!(
            !(200..300).contains(&first),
            "{token_type}: the first attempt was answered {first} before the majority had it"
        );
        // 503 `database_unavailable`, retry later: the record its snapshot shows is not
        // the majority's yet, and its attempts' budget ends.
        assert_eq!(
            (retry, retry_body["code"].as_str()),
            (503, Some("database_unavailable")),
            "{token_type}: the retry while its first attempt was applied, not durable: {retry_body}"
        );
        // Once the majority has the first attempt, a retry replays it: one token, the
        // only one redeemed.
        let mut replayed = (0, Value::Null);
        for _ in 0..20 {
            replayed = redeem(app.address.clone()).await;
            if replayed.0 == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(replayed.0, 200, "{token_type}: {}", replayed.1);
        assert_eq!(indexed_token_ids(&replayed.1).len(), 1, "{}", replayed.1);
        let redeemed = tokens
            .count_documents(doc! { "type": token_type, "status": "redeemed" })
            .await
            .unwrap();
        assert_eq!(redeemed, 1, "{token_type}");
    }
    redeemer.stop().await;
    app.stop().await;
}
