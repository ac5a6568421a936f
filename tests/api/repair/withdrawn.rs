//! Leftovers of a payment refunded meanwhile: a short set is completed and revoked, and
//! the active tokens of an issuance that crashed between its mark (or commit) and its
//! settle are revoked by the sweep of recent withdrawals, in either mode.

use std::time::Duration;

use mongodb::bson::{DateTime, doc, oid::ObjectId};

use super::{
    FAST_REPAIR, REPAIR_WITHIN, ago, issuing_record, record_of, repairs, seed,
    wait_until_none_issuing,
};
use crate::helpers::*;

/// Stores Stripe payment `payment` as refunded in full at `at` (its last event
/// `charge.refunded`) straight into the database: no settle runs, so only the repair can
/// revoke the tokens seeded for it.
async fn store_refunded(app: &TestApp, payment: &str, at: DateTime) {
    app.store_payment(
        ("stripe", "acct_1", payment),
        "refunded",
        "charge.refunded",
        at,
    )
    .await;
}

#[tokio::test]
async fn a_short_set_of_a_refunded_payment_is_completed_and_revoked() {
    let app = spawn_app_with(FAST_REPAIR).await;
    let revoked_before = repairs(&app, "revoked").await;
    let created_at = ago(Duration::from_secs(60));
    // The refund was recorded while the crashed writer was between its writes, after it
    // had checked the payment: nothing revoked its tokens yet.
    store_refunded(&app, "pi_refunded", created_at).await;
    let record = issuing_record("pi_refunded", ObjectId::new(), 30, created_at);
    let seeded = seed(&app.db, record, 0..10).await;

    wait_until_none_issuing(&app.db, REPAIR_WITHIN).await;

    let record = record_of(&app.db, "pi_refunded").await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    let stored = payment_tokens(&app.db, "pi_refunded").await;
    let indexes: Vec<i64> = stored
        .iter()
        .map(|t| t.get_i64("tokenIndex").unwrap())
        .collect();
    assert_eq!(indexes, (0..30).collect::<Vec<_>>());
    for token in &stored {
        assert_eq!(token.get_str("status"), Ok("revoked"), "{token}");
        assert_eq!(token.get_str("revocationReason"), Ok("refunded"), "{token}");
    }
    // The ten tokens written before the crash kept their ids.
    for before in &seeded.tokens {
        let index = before.get_i64("tokenIndex").unwrap() as usize;
        assert_eq!(stored[index].get("_id"), before.get("_id"));
    }
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    let revoked = repairs(&app, "revoked").await;
    assert!(
        revoked >= revoked_before + 1.0,
        "tokenmint_repairs_total{{outcome=\"revoked\"}} went from {revoked_before} to {revoked}"
    );
}

/// An atomic issuance commits its record `issued` with every token, then re-reads the
/// payment. A process that died between the two, while a refund's own settle had already
/// run (before the commit made the tokens visible), leaves a complete, issued set of
/// active tokens that nobody else would revoke: the sweep of recent withdrawals does.
#[tokio::test]
async fn a_crashed_atomic_issuance_after_a_refund_is_revoked_by_the_sweep() {
    crashed_after_the_mark_is_revoked_by_the_sweep("atomic").await;
}

/// Group commit marks its records `issued` while it re-reads the payments: a process
/// that died after the mark but before the settle leaves the same state in upsert mode.
#[tokio::test]
async fn a_crashed_upsert_issuance_marked_before_its_settle_is_revoked_by_the_sweep() {
    crashed_after_the_mark_is_revoked_by_the_sweep("upsert").await;
}

/// A complete, `issued` set of active tokens of a payment refunded 5 s ago, left by an
/// issuance in `mode` that died before its settle: the sweep revokes every token.
async fn crashed_after_the_mark_is_revoked_by_the_sweep(mode: &str) {
    let app = spawn_app_with(FAST_REPAIR).await;
    let refunded_at = ago(Duration::from_secs(5));
    store_refunded(&app, "pi_atomic_refunded", refunded_at).await;
    let mut record = issuing_record("pi_atomic_refunded", ObjectId::new(), 3, refunded_at);
    record.insert("status", "issued");
    record.insert("mode", mode);
    seed(&app.db, record, 0..3).await;

    let started = std::time::Instant::now();
    while app
        .count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_atomic_refunded", "status": "active" },
        )
        .await
        > 0
    {
        assert!(
            started.elapsed() < REPAIR_WITHIN,
            "the sweep left the refunded payment's tokens active"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let states = app.token_states("pi_atomic_refunded").await;
    assert_eq!(
        states,
        (0..3)
            .map(|i| (i, "revoked".to_owned()))
            .collect::<Vec<_>>()
    );
    // `verify` reads at majority: the revoke this test saw locally is in that snapshot
    // once the majority commit point passes it, a moment later.
    let store = app.store().await;
    let started = std::time::Instant::now();
    loop {
        let report = store.verify().await.unwrap();
        if report.is_clean() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{report}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An unfinished record the sweep cannot lease (the database fails the lease's write for
/// it, every time) does not starve the sweep of recent withdrawals, which runs on the
/// same tick: the tokens a refunded payment's lost settle left active are revoked all the
/// same.
#[tokio::test]
async fn a_record_that_cannot_be_leased_does_not_stop_the_sweep_of_withdrawals() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, FAST_REPAIR).await;
    let stuck_at = ago(Duration::from_secs(60));
    seed(
        &app.db,
        issuing_record("pi_unleasable", ObjectId::new(), 3, stuck_at),
        0..1,
    )
    .await;
    let issuances = format!("{}.issuances", app.db_name);
    let lease_fails =
        FailPoint::always_on(&name, &["findAndModify"], &issuances, Fault::error(91)).await;
    let refunded_at = ago(Duration::from_secs(5));
    store_refunded(&app, "pi_swept", refunded_at).await;
    let mut record = issuing_record("pi_swept", ObjectId::new(), 3, refunded_at);
    record.insert("status", "issued");
    seed(&app.db, record, 0..3).await;

    let started = std::time::Instant::now();
    let active = doc! { "origin.paymentIntentId": "pi_swept", "status": "active" };
    while app.count("tokens", active.clone()).await > 0 {
        assert!(
            started.elapsed() < REPAIR_WITHIN,
            "the refunded payment's tokens stayed active"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(lease_fails.off().await > 0, "the lease never failed");
    let stuck = record_of(&app.db, "pi_unleasable").await;
    assert_eq!(stuck.get_str("status"), Ok("issuing"), "{stuck}");
}
