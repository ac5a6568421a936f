//! Partial refunds: a refund of part of a payment takes back floor(quantity × refunded ÷
//! amount) of its tokens, highest tokenIndex first, active ones only (redeemed ones stay
//! redeemed and are the shortfall); the payment keeps standing for the rest. Stripe
//! (`charge.refunded` with `refunded: false`) and Standard Webhooks (`payment.refunded`
//! with `data.amountRefunded`).
//!
//! [`shares`] is how much a refund takes back and from which tokens; [`ordering`] is a
//! refund that arrives before the tokens exist, or after a backend issued them.

mod ordering;
mod shares;

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::provider_events::*;

/// The payment document of `payment`, which must exist.
async fn payment_doc(app: &TestApp, payment: &str) -> Document {
    app.find_stored("payments", doc! { "paymentIntentId": payment })
        .await
}

/// How many tokens a receipt says were revoked (absent: none).
fn revoked_in(receipt: &Value) -> u64 {
    receipt
        .get("tokensRevoked")
        .map_or(0, |n| n.as_u64().expect("tokensRevoked is a count"))
}

/// Delivers a Stripe event, signed, and asserts it was a first delivery: the receipt.
async fn stripe(app: &TestApp, event: &Value) -> Value {
    let response = deliver_stripe(app, event).await;
    assert_eq!(response.status(), 200, "{event}");
    let receipt = json(response).await;
    assert_eq!(receipt["duplicate"], false, "{receipt}");
    receipt
}

/// Delivers a Standard Webhooks event of provider `acme`, likewise.
async fn acme(app: &TestApp, id: &str, event: &Value) -> Value {
    let response = send_acme(app, id, event).await;
    assert_eq!(response.status(), 200, "{event}");
    let receipt = json(response).await;
    assert_eq!(receipt["duplicate"], false, "{receipt}");
    receipt
}

/// A Standard Webhooks `payment.succeeded` of `amount` buying `quantity` tokens.
fn acme_paid(payment: &str, version: i64, amount: i64, quantity: i64) -> Value {
    let mut event = acme_event("succeeded", payment, version);
    event["data"]["amount"] = json!(amount);
    event["data"]["currency"] = json!("eur");
    event["data"]["quantity"] = json!(quantity);
    event
}
