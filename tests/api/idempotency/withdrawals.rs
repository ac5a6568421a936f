//! A key's answer and the money behind the token: a refusal on a token its payment's
//! money took back is kept like any other, also once money coming back makes the token
//! active again; a new key acts on it; a refusal that could not be kept is not given.

use serde_json::Value;

use super::{key_records, redeem_keyed};
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe, dispute, intent_event};

const PAID_AT: i64 = 1_780_000_000;

async fn stripe(app: &TestApp, event: &Value) {
    assert_eq!(deliver_stripe(app, event).await.status(), 200);
}

/// Pays `payment` (4 tokens) and withdraws a dispute of half of it: token 3 is revoked
/// by the money. The payment's token ids.
async fn paid_then_disputed(app: &TestApp, payment: &str) -> Vec<String> {
    stripe(
        app,
        &intent_event("evt_paid", "succeeded", payment, PAID_AT, "4"),
    )
    .await;
    let ids = app.stored_token_ids(payment).await;
    stripe(
        app,
        &dispute("evt_dw", "funds_withdrawn", payment, 500, PAID_AT + 10),
    )
    .await;
    ids
}

#[tokio::test]
async fn a_refusal_on_a_token_the_money_took_back_is_kept_when_the_money_comes_back() {
    let app = spawn_app_with(PROVIDERS).await;
    let ids = paid_then_disputed(&app, "pi_back").await;
    let refused = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-back").await;
    assert_eq!((refused.status, refused.replayed), (409, false));

    // The dispute is won: token 3 stands again. The request retried with its key is
    // answered as it was the first time, and writes nothing.
    stripe(
        &app,
        &dispute("evt_dr", "funds_reinstated", "pi_back", 500, PAID_AT + 20),
    )
    .await;
    let token = app.stored_token(&ids[3]).await;
    assert_eq!(token.get_str("status").unwrap(), "active", "{token}");
    let retried = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-back").await;
    assert_eq!((retried.status, retried.replayed), (409, true));
    assert_eq!(retried.body, refused.body);
    assert_eq!(app.stored_token(&ids[3]).await, token, "nothing written");
    // A new key is a new request: it redeems the token.
    let redeemed = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-back-2").await;
    assert_eq!((redeemed.status, redeemed.replayed), (200, false));
    let token = app.stored_token(&ids[3]).await;
    assert_eq!(token.get_str("status").unwrap(), "redeemed", "{token}");
}

/// A refusal is kept after the action, in a write of its own. When that write fails, the
/// refusal is not given: the client would hear a 409 its key's retry, run again once the
/// money came back, answers differently. It hears 503 (which says nothing of what
/// happened), the key is taken back, and the retry runs the action: a redeem, now.
#[tokio::test]
async fn a_refusal_whose_keeping_failed_is_answered_503_and_the_retry_runs_the_action() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, PROVIDERS).await;
    let ids = paid_then_disputed(&app, "pi_lost").await;
    let revoked = app.stored_token(&ids[3]).await;
    // Keeping the answer is the flow's only `update` of a key record (the claim is a
    // findAndModify); 91 is retried once by the driver, so it fails twice.
    let namespace = format!("{}.idempotency_keys", app.db_name);
    let failpoint = FailPoint::set_on(&name, &["update"], &namespace, Fault::error(91), 2).await;
    let refused = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-lost").await;
    assert_eq!(failpoint.off().await, 2, "the keeping failed");
    assert_eq!((refused.status, refused.replayed), (503, false));
    let problem: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(problem["code"], "database_unavailable", "{problem}");
    assert_eq!(app.stored_token(&ids[3]).await, revoked, "nothing written");
    // Taken back in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !key_records(&app, "admin").await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the key is taken back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    stripe(
        &app,
        &dispute("evt_dr", "funds_reinstated", "pi_lost", 500, PAID_AT + 20),
    )
    .await;
    let retried = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-lost").await;
    assert_eq!((retried.status, retried.replayed), (200, false));
    let token = app.stored_token(&ids[3]).await;
    assert_eq!(token.get_str("status").unwrap(), "redeemed", "{token}");
    let again = redeem_keyed(&app, ADMIN_KEY, &ids[3], "k-lost").await;
    assert_eq!((again.status, again.replayed), (200, true));
    assert_eq!(again.body, retried.body);
}
