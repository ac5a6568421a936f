//! Provider deliveries for the HTTP tests: a test app with a Stripe and a Standard
//! Webhooks provider configured, event bodies, and signed senders.

use mongodb::bson::doc;
use serde_json::{Value, json};
use tokenmint::webhooks::signature::{sign_standard, sign_stripe};

use crate::helpers::*;

pub const STRIPE_OLD: &str = "whsec_test_old_secret_0123456789";
pub const STRIPE_NEW: &str = "whsec_test_new_secret_0123456789";
pub const ACME_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub const PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = ["whsec_test_old_secret_0123456789", "whsec_test_new_secret_0123456789"]

[providers.acme]
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;

pub async fn app() -> TestApp {
    spawn_app_with(PROVIDERS).await
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Stripe PaymentIntent event with tokenmint metadata (owner OWNER, standard, `quantity`).
pub fn intent_event(
    event_id: &str,
    kind: &str,
    payment: &str,
    created: i64,
    quantity: &str,
) -> Value {
    json!({
        "id": event_id, "type": format!("payment_intent.{kind}"), "created": created, "account": "acct_1",
        "data": { "object": {
            "id": payment, "amount": 1000, "currency": "eur", "status": kind,
            "metadata": { "tokenmint_owner": OWNER, "tokenmint_token_type": "standard", "tokenmint_quantity": quantity },
        }},
    })
}

/// A Checkout Session event as Stripe documents it (an `event` whose object is the
/// `checkout.session`), trimmed: `kind` is `completed`, `async_payment_succeeded`, …
pub fn session_event(
    event_id: &str,
    kind: &str,
    payment: &str,
    payment_status: &str,
    created: i64,
    metadata: Value,
) -> Value {
    json!({
        "id": event_id, "object": "event", "api_version": "2025-06-30.basil",
        "created": created, "livemode": false, "pending_webhooks": 1,
        "request": { "id": null, "idempotency_key": null },
        "type": format!("checkout.session.{kind}"), "account": "acct_1",
        "data": { "object": {
            "id": format!("cs_test_{payment}"), "object": "checkout.session",
            "amount_subtotal": 1000, "amount_total": 1000, "currency": "eur",
            "customer_details": { "email": "jenny@example.com", "name": "Jenny Rosen" },
            "livemode": false, "metadata": metadata, "mode": "payment",
            "payment_intent": payment, "payment_status": payment_status,
            "status": if kind == "expired" { "expired" } else { "complete" },
            "success_url": "https://example.com/success",
        } },
    })
}

pub fn refund_event(event_id: &str, payment: &str, created: i64) -> Value {
    json!({
        "id": event_id, "type": "charge.refunded", "created": created, "account": "acct_1",
        "data": { "object": { "id": "ch_1", "payment_intent": payment, "refunded": true, "amount_refunded": 1000 } },
    })
}

pub async fn send_stripe(
    app: &TestApp,
    event: &Value,
    secret: &str,
    signed_at: i64,
) -> reqwest::Response {
    let body = event.to_string();
    app.http
        .post(app.url("/v1/webhooks/stripe"))
        .header("content-type", "application/json")
        .header(
            "stripe-signature",
            sign_stripe(secret, signed_at, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Delivers a Stripe event as Stripe would now: signed with the current secret.
pub async fn deliver_stripe(app: &TestApp, event: &Value) -> reqwest::Response {
    send_stripe(app, event, STRIPE_NEW, now()).await
}

pub async fn send_acme(app: &TestApp, id: &str, event: &Value) -> reqwest::Response {
    let body = event.to_string();
    let ts = now();
    app.http
        .post(app.url("/v1/webhooks/acme"))
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header(
            "webhook-signature",
            sign_standard(ACME_SECRET, id, ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
}

pub fn acme_event(kind: &str, payment: &str, version: i64) -> Value {
    json!({ "type": format!("payment.{kind}"), "timestamp": "2026-11-30T00:00:00Z",
        "data": { "paymentIntentId": payment, "version": version, "owner": OWNER, "tokenType": "standard", "quantity": 2 } })
}

pub async fn payment_status(app: &TestApp, payment: &str) -> (String, i64) {
    let doc = app
        .find_stored("payments", doc! { "paymentIntentId": payment })
        .await;
    let version = doc
        .get("version")
        .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
        .unwrap();
    (doc.get_str("status").unwrap().to_owned(), version)
}

/// A Stripe Dispute event (`funds_withdrawn` or `funds_reinstated`) of `amount`.
pub fn dispute(event_id: &str, kind: &str, payment: &str, amount: i64, created: i64) -> Value {
    json!({
        "id": event_id, "object": "event", "type": format!("charge.dispute.{kind}"),
        "created": created, "account": "acct_1", "livemode": false,
        "data": { "object": {
            "id": "du_1", "object": "dispute", "charge": "ch_1", "payment_intent": payment,
            "amount": amount, "currency": "eur", "reason": "fraudulent",
            "status": if kind == "funds_reinstated" { "won" } else { "needs_response" },
        } },
    })
}

/// A Stripe `charge.refunded` for part of a charge: `refunded: false`, `amount_refunded`
/// of `amount` (minor units) refunded so far.
pub fn partial_refund_event(
    event_id: &str,
    payment: &str,
    created: i64,
    amount: i64,
    amount_refunded: i64,
) -> Value {
    json!({
        "id": event_id, "type": "charge.refunded", "created": created, "account": "acct_1",
        "data": { "object": {
            "id": "ch_1", "payment_intent": payment, "amount": amount,
            "refunded": false, "amount_refunded": amount_refunded,
        } },
    })
}

/// Every document of `payments`, `issuances` and `tokens`, in `_id` order: what a refused
/// event must leave exactly as it was.
pub async fn payment_state(app: &TestApp) -> Vec<mongodb::bson::Document> {
    let mut all = Vec::new();
    for collection in ["payments", "issuances", "tokens"] {
        all.extend(documents_by_id(&app.db, collection).await);
    }
    all
}

/// The outcome `webhook_events` recorded for `event_id`.
pub async fn recorded_outcome(app: &TestApp, event_id: &str) -> String {
    app.find_stored("webhook_events", doc! { "eventId": event_id })
        .await
        .get_str("outcome")
        .unwrap()
        .to_owned()
}
