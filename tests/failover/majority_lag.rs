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
//!
//! Then another reference: a redemption that finds the owner's only token spent by a
//! redemption the majority does not have yet must not be refused 409
//! `insufficient_balance` either (a failover may roll that one back, and then the same
//! request would succeed), but answered 503 until the majority has it, then refused.
//!
//! Then an atomic issuance whose commit gives up waiting for the majority: 503, its retry
//! while the majority still lags 503 too (the record in the way is not the majority's
//! yet: neither a replay nor a bug), then a replay of the committed tokens.
//!
//! Last a single token's redeem with its `reference` and `If-Match`: 503, its retry
//! while the majority lags 503 (not 412 for the version its own first attempt made),
//! then a replay.

use std::time::Duration;

use mongodb::Database;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};
use tokenmint_test_support::{ADMIN_KEY, OWNER, indexed_token_ids, issuance_body};

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
    another_reference_waits_for_the_majority(&http, &admin, &app.address, &redeemer.address).await;
    atomic_issuance_waits_for_the_majority(&http, &admin, &app.address, &redeemer.address).await;
    token_redeem_waits_for_the_majority(&http, &admin, &app.address, &redeemer.address).await;
    redeemer.stop().await;
    app.stop().await;
}

/// A redemption of another reference, for the token a lagging redemption spent: 503
/// while the majority lags (a refusal would rest on what a failover may roll back),
/// 409 `insufficient_balance` once the majority has the first.
async fn another_reference_waits_for_the_majority(
    http: &reqwest::Client,
    admin: &Database,
    app: &str,
    impatient: &str,
) {
    stock_tokens(http, app, "pi_majority_lagother", "lagother", 1).await;
    let redeem = |base: &str, reference: &str| {
        let request = http
            .post(format!("{base}/v1/redemptions"))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({
                "owner": OWNER, "tokenType": "lagother", "quantity": 1, "reference": reference,
            }));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    snapshotting(admin, "alwaysOn").await;
    let (first, first_body) = redeem(impatient, "lagother-first").await;
    eprintln!("failover[majority-lag] lagother: first answered {first}: {first_body}");
    let (other, other_body) = redeem(impatient, "lagother-second").await;
    eprintln!("failover[majority-lag] lagother: another reference answered {other}: {other_body}");
    snapshotting(admin, "off").await;
    assert!(
        !(200..300).contains(&first),
        "lagother: {first} {first_body}"
    );
    assert_eq!(
        (other, other_body["code"].as_str()),
        (503, Some("database_unavailable")),
        "another reference while the token's redemption was applied, not durable: {other_body}"
    );
    let mut refused = (0, Value::Null);
    for _ in 0..20 {
        refused = redeem(app, "lagother-second").await;
        if refused.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        (
            refused.0,
            refused.1["code"].as_str(),
            refused.1["available"].as_u64()
        ),
        (409, Some("insufficient_balance"), Some(0)),
        "once the majority has the first: {}",
        refused.1
    );
    let replayed = redeem(app, "lagother-first").await;
    assert_eq!(replayed.0, 200, "{}", replayed.1);
}

/// An atomic issuance whose commit applied on the primary and gave up waiting for the
/// majority: 503, then 503 for its retry while the majority lags (a record is in the
/// way that a majority read does not find), then a replay (200, nothing created) of the
/// tokens it committed, once.
async fn atomic_issuance_waits_for_the_majority(
    http: &reqwest::Client,
    admin: &Database,
    app: &str,
    impatient: &str,
) {
    let mut body = issuance_body("pi_majority_atomic", 2);
    body["mode"] = json!("atomic");
    let issue = |base: &str| {
        let request = http
            .post(format!("{base}/v1/issuances"))
            .bearer_auth(ADMIN_KEY)
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    snapshotting(admin, "alwaysOn").await;
    let (first, first_body) = issue(impatient).await;
    eprintln!("failover[majority-lag] atomic: first answered {first}: {first_body}");
    // On the impatient instance too: a write of the retry's that waits for the majority
    // (a patient one waits until the request's own timeout) gives up after its 2 s.
    let (retry, retry_body) = issue(impatient).await;
    eprintln!("failover[majority-lag] atomic: retry answered {retry}: {retry_body}");
    snapshotting(admin, "off").await;
    assert_eq!(
        (first, first_body["code"].as_str()),
        (503, Some("database_unavailable")),
        "the commit the majority did not confirm: {first_body}"
    );
    assert_eq!(
        (retry, retry_body["code"].as_str()),
        (503, Some("database_unavailable")),
        "the retry while the majority lags: {retry_body}"
    );
    let mut replayed = (0, Value::Null);
    for _ in 0..20 {
        replayed = issue(app).await;
        if replayed.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        (replayed.0, &replayed.1["created"]),
        (200, &json!(0)),
        "{}",
        replayed.1
    );
    assert_eq!(indexed_token_ids(&replayed.1).len(), 2, "{}", replayed.1);
}

/// A redeem of one token, with its `reference` and `If-Match: "0"`, whose write gave up
/// waiting for the majority: 503; its retry while the majority lags reads the token
/// active and its gated write misses the version its own first attempt made: 503, not
/// 412; once the majority has it, a replay (200), the token redeemed once.
async fn token_redeem_waits_for_the_majority(
    http: &reqwest::Client,
    admin: &Database,
    app: &str,
    impatient: &str,
) {
    let mut body = issuance_body("pi_majority_redeem", 1);
    body["tokenType"] = json!("lagredeem");
    let issued: Value = http
        .post(format!("{app}/v1/issuances"))
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = indexed_token_ids(&issued).remove(0).1;
    let redeem = |base: &str| {
        let request = http
            .post(format!("{base}/v1/tokens/{id}/redeem"))
            .bearer_auth(ADMIN_KEY)
            .header("If-Match", "\"0\"")
            .json(&json!({ "reference": "lagredeem" }));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    snapshotting(admin, "alwaysOn").await;
    let (first, first_body) = redeem(impatient).await;
    eprintln!("failover[majority-lag] redeem: first answered {first}: {first_body}");
    let (retry, retry_body) = redeem(impatient).await;
    eprintln!("failover[majority-lag] redeem: retry answered {retry}: {retry_body}");
    snapshotting(admin, "off").await;
    assert_eq!(
        (first, first_body["code"].as_str()),
        (503, Some("database_unavailable")),
        "the write the majority did not confirm: {first_body}"
    );
    assert_eq!(
        (retry, retry_body["code"].as_str()),
        (503, Some("database_unavailable")),
        "the retry while the majority lags: {retry_body}"
    );
    let mut replayed = (0, Value::Null);
    for _ in 0..20 {
        replayed = redeem(app).await;
        if replayed.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        (replayed.0, &replayed.1["version"], &replayed.1["status"]),
        (200, &json!(1), &json!("redeemed")),
        "{}",
        replayed.1
    );
}
