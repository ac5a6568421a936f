//! A key's answer and the money behind the token: a refusal that money coming back may
//! lift is not kept, one that stands for good is.

use serde_json::{Value, json};

use super::redeem_keyed;
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe, intent_event};

const PAID_AT: i64 = 1_780_000_000;

/// A Stripe Dispute event of 500 of the payment's 1000 cents: `funds_withdrawn` takes 2
/// of its 4 tokens back, `funds_reinstated` (the dispute won) gives them back.
fn dispute(event_id: &str, kind: &str, payment: &str, created: i64) -> Value {
    json!({
        "id": event_id, "object": "event", "type": format!("charge.dispute.{kind}"),
        "created": created, "account": "acct_1", "livemode": false,
        "data": { "object": {
            "id": "du_1", "object": "dispute", "charge": "ch_1", "payment_intent": payment,
            "amount": 500, "currency": "eur", "reason": "fraudulent",
            "status": if kind == "funds_reinstated" { "won" } else { "needs_response" },
        } },
    })
}

async fn stripe(app: &TestApp, event: &Value) {
    assert_eq!(deliver_stripe(app, event).await.status(), 200);
}

#[tokio::test]
async fn a_redeem_refused_for_a_token_a_withdrawal_revoked_is_not_kept_for_its_key() {
    let app = spawn_app_with(PROVIDERS).await;
    stripe(
        &app,
        &intent_event("evt_paid", "succeeded", "pi_back", PAID_AT, "4"),
    )
    .await;
    let ids = app.stored_token_ids("pi_back").await;
    stripe(
        &app,
        &dispute("evt_dw", "funds_withdrawn", "pi_back", PAID_AT + 10),
    )
    .await;
    // Token 3 was taken back by the dispute, token 0 by an operator.
    let revoke = app
        .http
        .post(app.url(&format!("/v1/tokens/{}/revoke", ids[0])))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({ "reason": "fraud" }))
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status(), 200);
    for id in [&ids[0], &ids[3]] {
        let refused = redeem_keyed(&app, ADMIN_KEY, id, &format!("k-{id}")).await;
        assert_eq!(refused.status, 409, "{id}");
    }

    // The dispute is won: token 3 stands again, and the same request, retried with its
    // key, redeems it instead of hearing the refusal again.
    stripe(
        &app,
        &dispute("evt_dr", "funds_reinstated", "pi_back", PAID_AT + 20),
    )
    .await;
    let retried = redeem_keyed(&app, ADMIN_KEY, &ids[3], &format!("k-{}", ids[3])).await;
    assert_eq!(retried.status, 200);
    assert!(!retried.replayed);
    let token = app.stored_token(&ids[3]).await;
    assert_eq!(token.get_str("status").unwrap(), "redeemed", "{token}");
    // An operator's revoke is for good: its refusal is kept, and replayed.
    let kept = redeem_keyed(&app, ADMIN_KEY, &ids[0], &format!("k-{}", ids[0])).await;
    assert_eq!((kept.status, kept.replayed), (409, true));
    let token = app.stored_token(&ids[0]).await;
    assert_eq!(token.get_str("status").unwrap(), "revoked", "{token}");
}
