//! A SIGKILL at the one step where a settle could be lost: the tokens of a payment partly
//! refunded long ago are written (atomic mode: committed), and the process dies while
//! its revoke of the refunded share cannot reach the database (a failpoint closes the
//! connection of every `update` it sends; one merely held up would still run on the
//! server after the kill). The refund
//! is older than the sweep of recent withdrawals looks back, and it left no placeholder
//! (recorded before any issuance, its hour long over): only the record, still `issuing`,
//! tells the restarted service that the set was never settled.

use std::time::{Duration, Instant};

use mongodb::bson::{DateTime, Document, doc};
use serde_json::json;
use tokenmint_test_support::*;

use crate::self_repair::FAST_REPAIR;

/// A payment of 1000 of which 250 were refunded two hours ago, as the store records it.
async fn refunded_long_ago(store: &tokenmint::store::Store, payment: &str) {
    let long_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 7_200_000);
    store
        .database()
        .collection::<Document>("payments")
        .insert_one(doc! {
            "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
            "status": "succeeded", "version": 1_i64, "amount": 1000_i64,
            "amountRefunded": 250_i64, "refunds": [{ "id": "re_1", "amount": 250_i64 }],
            "lastEventId": "evt_r", "lastEventType": "charge.refunded",
            "createdAt": long_ago, "updatedAt": long_ago,
        })
        .await
        .expect("payment stored");
}

async fn record_status(store: &tokenmint::store::Store, payment: &str) -> String {
    let record = store
        .database()
        .collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
        .expect("the record");
    record.get_str("status").unwrap().to_owned()
}

async fn active_indexes(store: &tokenmint::store::Store, payment: &str) -> Vec<i64> {
    payment_tokens(store.database(), payment)
        .await
        .iter()
        .filter(|t| t.get_str("status") == Ok("active"))
        .map(token_index)
        .collect()
}

pub(super) async fn scenario(mode: &str) {
    let scratch = ScratchDatabase::create("crash_settle").await;
    let store = scratch.store();
    let payment = payment_id(mode);
    refunded_long_ago(store, &payment).await;

    let name = unique_app_name();
    let mut service = Service::start_named(
        scratch.name(),
        &name,
        &[("TOKENMINT__REPAIR__ENABLED", "false")],
    );
    // In atomic mode the transaction's own update (the record committing `issuing`) goes
    // first: the revoke after the commit is the second.
    let cut_off = match mode {
        "atomic" => FailPoint::after_first(&name, &["update"], Fault::CloseConnection).await,
        _ => FailPoint::always(&name, &["update"], Fault::CloseConnection).await,
    };
    let request = {
        let url = format!("{}/v1/issuances", service.base);
        let body = json!({
            "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
            "owner": OWNER, "tokenType": "standard", "quantity": 10, "mode": mode,
        });
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(SERVICE_KEY)
                .json(&body)
                .send()
                .await
        })
    };
    assert!(
        cut_off.fired_within(1, Duration::from_secs(20)).await,
        "the revoke was never sent"
    );
    service.kill();
    // Answered 503 just before the kill, or cut off by it: either way nothing settled.
    let _ = request.await;
    cut_off.off().await;
    // Upsert mode writes the tokens with `w: 1` (the batch's mark, never sent here, is
    // what waits for the majority): a majority read sees them once the primary's next
    // journal commit has run, which a busy machine may hold back for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while payment_tokens(store.database(), &payment).await.len() < 10 {
        assert!(
            Instant::now() < deadline,
            "{mode}: the tokens were never written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(payment_tokens(store.database(), &payment).await.len(), 10);
    assert_eq!(
        active_indexes(store, &payment).await,
        (0..10).collect::<Vec<_>>()
    );
    assert_eq!(
        record_status(store, &payment).await,
        "issuing",
        "{mode}: the unsettled set's record"
    );

    // Restarted, with no request sent: the service settles the set on its own.
    let _restarted = Service::start_with(scratch.name(), &FAST_REPAIR);
    let deadline = Instant::now() + Duration::from_secs(30);
    while active_indexes(store, &payment).await != (0..8).collect::<Vec<_>>() {
        assert!(
            Instant::now() < deadline,
            "{mode}: the refunded share is still active: {:?}",
            active_indexes(store, &payment).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while record_status(store, &payment).await != "issued" {
        assert!(
            Instant::now() < deadline,
            "{mode}: the record is never marked"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "crash[settle-kill-{mode}]: killed with the revoke cut off, settled after the restart: tokens 0..7 active, 8..9 revoked"
    );
}

fn payment_id(mode: &str) -> String {
    format!("pi_settle_kill_{mode}")
}
