//! A SIGKILL at the one step where a settle could be lost: the tokens of a payment partly
//! refunded long ago are written (atomic mode: committed), the refunded share already
//! revoked, and the process dies while its settle cannot reach the database (a failpoint
//! closes the connection of every `update` of the tokens it sends after the write; one
//! merely held up would still run on the server after the kill). The refund
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
    let mut service = start_without_repair(&scratch, &name);
    // In atomic mode the transaction's own revoke of the share goes first: the settle's
    // after the commit is the second.
    let tokens = format!("{}.tokens", scratch.name());
    let skip = if mode == "atomic" { 1 } else { 0 };
    let cut_off =
        FailPoint::after_on(&name, &["update"], &tokens, skip, Fault::CloseConnection).await;
    let request = send_issuance(&service, &payment, mode);
    assert!(
        cut_off.fired_within(1, Duration::from_secs(20)).await,
        "the settle's revoke was never sent"
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
    // The share was written revoked: not even the lost settle left it active.
    assert_eq!(
        active_indexes(store, &payment).await,
        (0..8).collect::<Vec<_>>()
    );
    assert_eq!(
        record_status(store, &payment).await,
        "issuing",
        "{mode}: the unsettled set's record"
    );

    settled_after_restart(&scratch, &payment, mode).await;
}

/// Restarted, with no request sent: the service settles the set on its own, tokens 0..7
/// active, 8 and 9 revoked, the record `issued`.
async fn settled_after_restart(scratch: &ScratchDatabase, payment: &str, mode: &str) {
    let store = scratch.store();
    let _restarted = Service::start_with(scratch.name(), &FAST_REPAIR);
    let deadline = Instant::now() + Duration::from_secs(30);
    while active_indexes(store, payment).await != (0..8).collect::<Vec<_>>() {
        assert!(
            Instant::now() < deadline,
            "{mode}: the refunded share is still active: {:?}",
            active_indexes(store, payment).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while record_status(store, payment).await != "issued" {
        assert!(
            Instant::now() < deadline,
            "{mode}: the record is never marked"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "crash[settle-kill-{mode}]: killed before its settle, settled after the restart: tokens 0..7 active, 8..9 revoked"
    );
}

/// A refund recorded while the tokens are on their way: the batch read the payment
/// before it (nothing known), its token insert is held on the server, the partial refund
/// lands, and the process dies before the insert is answered. The server still runs the
/// insert: every token active, none of them revoked by anyone, and the record `issuing`.
/// The restarted service must take the share back itself.
pub(super) async fn refund_during_the_write() {
    let scratch = ScratchDatabase::create("crash_settle").await;
    let store = scratch.store();
    let payment = payment_id("refund_during_write");
    let name = unique_app_name();
    let mut service = start_without_repair(&scratch, &name);
    let tokens = format!("{}.tokens", scratch.name());
    // Held long enough for the refund and the kill to come first on a busy machine: a
    // batch answered before the kill would mark its record `issued`.
    let held = FailPoint::set_on(
        &name,
        &["insert"],
        &tokens,
        Fault::Block { millis: 3000 },
        1,
    )
    .await;
    let request = send_issuance(&service, &payment, "upsert");
    assert!(
        held.fired_within(1, Duration::from_secs(20)).await,
        "the token insert was never sent"
    );
    refunded_long_ago(store, &payment).await;
    service.kill();
    let _ = request.await;
    // Turning the failpoint off waits for the held insert, which then runs.
    held.off().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while active_indexes(store, &payment).await.len() < 10 {
        assert!(
            Instant::now() < deadline,
            "the held insert never wrote the tokens: {:?}",
            active_indexes(store, &payment).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(record_status(store, &payment).await, "issuing");
    settled_after_restart(&scratch, &payment, "refund-during-write").await;
}

/// The service on `scratch`, its client named `name`, without self-repair: only the
/// restarted one may settle what it leaves.
fn start_without_repair(scratch: &ScratchDatabase, name: &str) -> Service {
    Service::start_named(
        scratch.name(),
        name,
        &[("TOKENMINT__REPAIR__ENABLED", "false")],
    )
}

/// Sends the issuance of 10 tokens of `payment` in `mode` to `service`, in a task of its
/// own: the answer may never come (the process is killed).
fn send_issuance(
    service: &Service,
    payment: &str,
    mode: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
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
}

fn payment_id(mode: &str) -> String {
    format!("pi_settle_kill_{mode}")
}
