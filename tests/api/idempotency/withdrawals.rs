//! A key's answer and the money behind the token: a refusal on a token its payment's
//! money took back is kept like any other, also once money coming back makes the token
//! active again; a new key acts on it.

use serde_json::Value;

use super::redeem_keyed;
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe, dispute, intent_event};

const PAID_AT: i64 = 1_780_000_000;

async fn stripe(app: &TestApp, event: &Value) {
    assert_eq!(deliver_stripe(app, event).await.status(), 200);
}

#[tokio::test]
async fn a_refusal_on_a_token_the_money_took_back_is_kept_when_the_money_comes_back() {
    let app = spawn_app_with(PROVIDERS).await;
    stripe(
        &app,
        &intent_event("evt_paid", "succeeded", "pi_back", PAID_AT, "4"),
    )
    .await;
    let ids = app.stored_token_ids("pi_back").await;
    stripe(
        &app,
        &dispute("evt_dw", "funds_withdrawn", "pi_back", 500, PAID_AT + 10),
    )
    .await;
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
