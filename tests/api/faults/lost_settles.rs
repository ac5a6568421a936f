//! A settle lost after the tokens were written (the payment read or the revoke failed,
//! the process died) is done by the service itself, however old the refund: the record
//! stays `issuing` until its settle is done, and self-repair finishes what is `issuing`.
//! The refund here is older than the withdrawal lookback and its placeholder is gone (as
//! after its hour), so no sweep of recent withdrawals can be what heals it.

use std::time::{Duration, Instant};

use mongodb::bson::{DateTime, doc};
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

/// No repair on the faulty instance (its sweep's reads would meet the failpoint too, and
/// it would heal what the test wants to see healed by another instance).
const NO_REPAIR: &str = "[repair]\nenabled = false\n";
/// The instance that heals: sweeps every 200 ms, a record older than 500 ms is abandoned.
const REPAIRER: &str = "[repair]\ninterval_ms = 200\nmin_age_ms = 500\n";

/// A payment of 1000 partly refunded (250) long ago: its placeholder expired, and the
/// lookback of the sweep of recent withdrawals has passed.
async fn refunded_long_ago(app: &TestApp, payment: &str) {
    let refund = partial_refund_event(&format!("evt_{payment}_r"), payment, now(), 1000, 250);
    assert_eq!(deliver_stripe(app, &refund).await.status(), 200);
    let removed = app
        .db
        .collection::<mongodb::bson::Document>("issuances")
        .delete_many(doc! { "paymentIntentId": payment, "status": "placeholder" })
        .await
        .unwrap();
    assert_eq!(removed.deleted_count, 1, "the refund left a placeholder");
    // Recorded two hours ago: far beyond the sweep of recent withdrawals' lookback.
    let long_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 7_200_000);
    app.db
        .collection::<mongodb::bson::Document>("payments")
        .update_one(
            doc! { "paymentIntentId": payment },
            doc! { "$set": { "updatedAt": long_ago } },
        )
        .await
        .unwrap();
}

/// Active token indexes of `payment`, once they are `want` (or whatever they are after
/// `within`).
async fn active_once(app: &TestApp, payment: &str, want: &[i64], within: Duration) -> Vec<i64> {
    let deadline = Instant::now() + within;
    loop {
        let active = app.active_indexes(payment).await;
        if active == want || Instant::now() > deadline {
            return active;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn trusted_issuance(payment: &str, mode: &str) -> serde_json::Value {
    let mut body = issuance_body(payment, 10);
    body["mode"] = json!(mode);
    body
}

/// Tokens 0..7 of `payment`: what 10 tokens of a payment refunded 250 of 1000 keep.
fn standing() -> Vec<i64> {
    (0..8).collect()
}

/// Whatever the faulty instance answered, the service (another instance here, as after a
/// restart) settles what was written on its own: the refunded share ends revoked, the
/// record `issued`.
async fn healed_by_the_service(faulty: &TestApp, payment: &str) {
    let repairer = spawn_app_on(&faulty.db_name, &format!("{PROVIDERS}{REPAIRER}")).await;
    let active = active_once(&repairer, payment, &standing(), Duration::from_secs(20)).await;
    assert_eq!(active, standing(), "tokens 8 and 9 were refunded");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let record = faulty
            .find_stored("issuances", doc! { "paymentIntentId": payment })
            .await;
        if record.get_str("status") == Ok("issued") {
            break;
        }
        assert!(Instant::now() < deadline, "still not issued: {record}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issues 10 tokens of `payment` in `mode` while `commands` fail twice (the driver's own
/// retry included), then lets the service heal it.
async fn a_lost_settle_is_redone(mode: &str, payment: &str, commands: &[&str], fault: Fault) {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    refunded_long_ago(&faulty, payment).await;

    let failpoint = FailPoint::set(&name, commands, fault, 2).await;
    let answer = faulty
        .issue(WRITER_KEY, &trusted_issuance(payment, mode))
        .await;
    assert!(failpoint.off().await > 0, "the fault never happened");
    let status = answer.status().as_u16();
    assert!([201, 503].contains(&status), "{status}");
    if status == 201 {
        // The settle was done in the request after all: the answer's tokens say so.
        let active = active_once(&faulty, payment, &standing(), Duration::ZERO).await;
        assert_eq!(active, standing());
    }
    healed_by_the_service(&faulty, payment).await;
}

#[tokio::test]
async fn an_atomic_issuance_whose_revoke_fails_is_settled_by_the_service() {
    let payment = "pi_lost_atomic_revoke";
    a_lost_settle_is_redone("atomic", payment, &["update"], Fault::error(91)).await;
}

#[tokio::test]
async fn an_upsert_issuance_whose_revoke_fails_is_settled_by_the_service() {
    let payment = "pi_lost_upsert_revoke";
    a_lost_settle_is_redone("upsert", payment, &["update"], Fault::error(91)).await;
}

#[tokio::test]
async fn an_upsert_issuance_whose_settle_read_is_cut_off_is_settled_by_the_service() {
    // Every `find` but the first (the batch's payment read before writing): on a design
    // that reads the payment again after the tokens, that read is the one cut off.
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_lost_upsert_read";
    refunded_long_ago(&faulty, payment).await;
    let failpoint = FailPoint::after_first(&name, &["find"], Fault::CloseConnection).await;
    let answer = faulty
        .issue(WRITER_KEY, &trusted_issuance(payment, "upsert"))
        .await;
    failpoint.off().await;
    let status = answer.status().as_u16();
    assert!([201, 503].contains(&status), "{status}");
    healed_by_the_service(&faulty, payment).await;
}

/// A token as stored: (tokenIndex, status, revocationReason, lastChangedBy, _version).
type Stored = (i64, String, String, String, i32);

/// Tokens of `payment` as stored, in tokenIndex order.
async fn stored_states(app: &TestApp, payment: &str) -> Vec<Stored> {
    let text = |t: &mongodb::bson::Document, field: &str| t.get_str(field).unwrap_or("").to_owned();
    app.tokens_of(payment)
        .await
        .iter()
        .map(|t| {
            (
                t.get_i64("tokenIndex").unwrap(),
                text(t, "status"),
                text(t, "revocationReason"),
                text(t, "lastChangedBy"),
                t.get_i32("_version").unwrap(),
            )
        })
        .collect()
}

/// A token of a partly refunded payment as written: active below the share, revoked by
/// the provider from it up, in its first version either way (nobody saw it active).
fn written(index: i64, share_from: i64) -> Stored {
    if index < share_from {
        (index, "active".into(), String::new(), String::new(), 0)
    } else {
        let (reason, by) = ("partial_refund".into(), "provider:stripe".into());
        (index, "revoked".into(), reason, by, 0)
    }
}

/// What 10 tokens of a payment refunded 250 of 1000 are written as: 0..7 active, the
/// refunded share 8 and 9 revoked by the provider, as a settle revokes them.
fn written_with_the_share_revoked() -> Vec<Stored> {
    (0..10).map(|index| written(index, 8)).collect()
}

/// A refund known before the tokens are written: its share is written revoked, so not
/// even a settle that never runs (its first command, the read of the spent tokens,
/// fails every time here, and nothing heals) leaves a token of it active for a moment.
async fn a_known_share_is_never_active(mode: &str, payment: &str) {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    refunded_long_ago(&faulty, payment).await;

    let tokens = format!("{}.tokens", faulty.db_name);
    let failpoint = FailPoint::always_on(&name, &["find"], &tokens, Fault::error(91)).await;
    let answer = faulty
        .issue(WRITER_KEY, &trusted_issuance(payment, mode))
        .await;
    assert!(
        failpoint.off().await > 0,
        "the settle never read the tokens"
    );
    assert_eq!(answer.status().as_u16(), 503, "the settle failed");
    assert_eq!(
        stored_states(&faulty, payment).await,
        written_with_the_share_revoked()
    );
    healed_by_the_service(&faulty, payment).await;
}

#[tokio::test]
async fn a_share_refunded_before_an_upsert_issuance_is_never_active() {
    a_known_share_is_never_active("upsert", "pi_known_share_upsert").await;
}

#[tokio::test]
async fn a_share_refunded_before_an_atomic_issuance_is_never_active() {
    a_known_share_is_never_active("atomic", "pi_known_share_atomic").await;
}

/// Sends `body` (upsert mode) twice on `faulty` (named `name`), whose payment was partly
/// refunded long ago: the first request writes its record but no token (its insert
/// fails), so the retry completes the set; that retry's settle fails after the write (its
/// reads of the tokens after the batch's and the completion's count are cut off), and
/// nothing heals.
async fn complete_with_a_lost_settle(faulty: &TestApp, name: &str, body: &serde_json::Value) {
    let tokens = format!("{}.tokens", faulty.db_name);
    let failpoint = FailPoint::set_on(name, &["insert"], &tokens, Fault::error(91), 2).await;
    let first = faulty.issue(WRITER_KEY, body).await;
    assert!(failpoint.off().await > 0, "the token insert never failed");
    assert_eq!(first.status().as_u16(), 503);
    let failpoint = FailPoint::after_on(name, &["find"], &tokens, 2, Fault::error(91)).await;
    let retry = faulty.issue(WRITER_KEY, body).await;
    assert!(failpoint.off().await > 0, "no read after the upsert failed");
    assert_eq!(retry.status().as_u16(), 503);
}

#[tokio::test]
async fn a_set_completed_after_a_refund_writes_its_share_revoked() {
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_known_share_completed";
    refunded_long_ago(&faulty, payment).await;
    complete_with_a_lost_settle(&faulty, &name, &trusted_issuance(payment, "upsert")).await;
    assert_eq!(
        stored_states(&faulty, payment).await,
        written_with_the_share_revoked()
    );
    healed_by_the_service(&faulty, payment).await;
}

#[tokio::test]
async fn a_set_completed_after_a_refund_counts_its_share_past_the_spent_tokens() {
    // 4 tokens of a payment refunded 250 of 1000: the share is one token. Token 3 was
    // written and spent before the rest of the set (a set completed late), so the share
    // is token 2, which the completion must write revoked.
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_known_share_spent";
    refunded_long_ago(&faulty, payment).await;
    let now = DateTime::now();
    faulty
        .db
        .collection::<mongodb::bson::Document>("tokens")
        .insert_one(doc! {
            "owner": mongodb::bson::oid::ObjectId::parse_str(OWNER).unwrap(),
            "type": "standard",
            "tokenIndex": 3_i64,
            "origin": {
                "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment,
                "date": now,
            },
            "status": "redeemed", "redeemedAt": now, "lastChangedBy": "key:backend",
            "_version": 1_i32, "createdAt": now, "updatedAt": now,
        })
        .await
        .unwrap();
    complete_with_a_lost_settle(&faulty, &name, &issuance_body(payment, 4)).await;
    let stored = stored_states(&faulty, payment).await;
    assert_eq!(stored[..3], [written(0, 2), written(1, 2), written(2, 2)]);
    assert_eq!(stored[3].1, "redeemed");
}

#[tokio::test]
async fn an_atomic_issuance_whose_revoke_of_the_share_fails_leaves_none_of_it_active() {
    // The transaction's revoke of the refunded share fails once: the transaction is
    // abandoned (nothing of it is visible) or tried again; either way, once the request
    // is answered 201 (sent again after a 503), the share is revoked and was never
    // active.
    let name = unique_app_name();
    let faulty = spawn_app_named(&name, &format!("{PROVIDERS}{NO_REPAIR}")).await;
    let payment = "pi_share_revoke_fails";
    refunded_long_ago(&faulty, payment).await;
    let tokens = format!("{}.tokens", faulty.db_name);
    let body = trusted_issuance(payment, "atomic");
    let failpoint = FailPoint::set_on(&name, &["update"], &tokens, Fault::error(91), 1).await;
    let first = faulty.issue(WRITER_KEY, &body).await;
    assert!(failpoint.off().await > 0, "the revoke never failed");
    match first.status().as_u16() {
        201 => {}
        503 => {
            assert_eq!(
                faulty.count("tokens", doc! {}).await,
                0,
                "nothing committed"
            );
            assert_eq!(faulty.issue(WRITER_KEY, &body).await.status(), 201);
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        stored_states(&faulty, payment).await,
        written_with_the_share_revoked()
    );
}
