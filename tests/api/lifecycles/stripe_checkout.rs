//! Stripe Checkout: the `checkout.session.*` events report the payment their session's
//! `payment_intent` names, with the token parameters of the session's `metadata` (else
//! the PaymentIntent's). A payment reported through both its session and its
//! PaymentIntent is issued once, whichever arrives first and however often: one record,
//! `quantity` tokens, all active.

use mongodb::bson::doc;
use serde_json::{Value, json};

use super::{nothing_written, recorded};
use crate::helpers::*;
use crate::provider_events::*;

/// `tokenmint_*` metadata for `quantity` tokens of OWNER.
fn token_metadata(quantity: i64) -> Value {
    json!({ "tokenmint_owner": OWNER, "tokenmint_token_type": "standard",
        "tokenmint_quantity": quantity.to_string(), "order": "A-1001" })
}

/// A `payment_intent.<kind>` event with `metadata` (which may name no tokens).
fn intent_with(event_id: &str, kind: &str, payment: &str, created: i64, metadata: Value) -> Value {
    let mut event = intent_event(event_id, kind, payment, created, "1");
    event["data"]["object"]["metadata"] = metadata;
    event
}

/// The payment has exactly one issuance record and `quantity` active tokens 0..quantity.
async fn issued_once(app: &TestApp, payment: &str, quantity: i64) {
    let filter = doc! { "paymentIntentId": payment };
    assert_eq!(app.count_records(filter).await, 1, "{payment}: one record");
    let record = app
        .find_stored(
            "issuances",
            doc! { "paymentIntentId": payment, "status": "issued" },
        )
        .await;
    assert_eq!(stored_int(&record, "quantity"), Some(quantity), "{payment}");
    let active: Vec<(i64, String)> = (0..quantity).map(|i| (i, "active".to_owned())).collect();
    assert_eq!(app.token_states(payment).await, active, "{payment}");
    assert_eq!(payment_status(app, payment).await.0, "succeeded");
}

#[tokio::test]
async fn a_paid_session_issues_from_its_own_metadata() {
    let app = app().await;
    let completed = session_event(
        "evt_cs",
        "completed",
        "pi_cs",
        "paid",
        now(),
        token_metadata(3),
    );
    let receipt = json(deliver_stripe(&app, &completed).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(receipt["tokensCreated"], 3);
    issued_once(&app, "pi_cs", 3).await;
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_cs" })
        .await;
    assert_eq!(payment.get_str("tokenParamsFixedBy").unwrap(), "evt_cs");
    assert_eq!(stored_int(&payment, "amount"), Some(1000), "amount_total");
    // Refunds keep arriving on the Charge, which names the PaymentIntent.
    let refund =
        json(deliver_stripe(&app, &refund_event("evt_re", "pi_cs", now() + 5)).await).await;
    assert_eq!(refund["tokensRevoked"], 3, "{refund}");
}

/// Every way a payment may be reported through both its session and its PaymentIntent:
/// the parameters on the session, on the PaymentIntent or on both; the PaymentIntent's
/// event first or last. Each is then delivered again (a duplicate), and again after its
/// dedupe record expired (a replay): still one record and `quantity` tokens.
#[tokio::test]
async fn a_payment_reported_by_session_and_payment_intent_is_issued_once_in_any_order() {
    let app = app().await;
    let t = now();
    let none = json!({ "order": "A-1001" });
    let placements = [
        ("session", token_metadata(2), none.clone()),
        ("intent", none.clone(), token_metadata(2)),
        ("both", token_metadata(2), token_metadata(2)),
    ];
    for (placement, on_session, on_intent) in placements {
        for intent_first in [true, false] {
            let payment = format!("pi_{placement}_{intent_first}");
            // Stripe creates the PaymentIntent's event a moment before the session's.
            let intent = intent_with(
                &format!("evt_pi_{payment}"),
                "succeeded",
                &payment,
                t,
                on_intent.clone(),
            );
            let session = session_event(
                &format!("evt_cs_{payment}"),
                "completed",
                &payment,
                "paid",
                t + 1,
                on_session.clone(),
            );
            let order = if intent_first {
                [&intent, &session]
            } else {
                [&session, &intent]
            };
            let mut outcomes = Vec::new();
            for event in order {
                let receipt = json(deliver_stripe(&app, event).await).await;
                outcomes.push(receipt["outcome"].as_str().unwrap().to_owned());
            }
            assert_eq!(
                outcomes.iter().filter(|o| *o == "issued").count(),
                1,
                "{payment}: {outcomes:?}"
            );
            issued_once(&app, &payment, 2).await;
            let before = payment_state(&app).await;
            for event in order {
                let again = json(deliver_stripe(&app, event).await).await;
                assert_eq!(again["duplicate"], true, "{payment}: {again}");
                let id = event["id"].as_str().unwrap();
                app.db
                    .collection::<mongodb::bson::Document>("webhook_events")
                    .delete_one(doc! { "eventId": id })
                    .await
                    .unwrap();
                let replay = json(deliver_stripe(&app, event).await).await;
                assert_ne!(replay["outcome"], "issued", "{payment}: {replay}");
                assert!(
                    replay["tokensCreated"].as_u64().unwrap_or(0) == 0,
                    "{replay}"
                );
            }
            issued_once(&app, &payment, 2).await;
            assert_eq!(
                payment_state(&app).await,
                before,
                "{payment}: the duplicates and replays changed nothing"
            );
        }
    }
    assert_eq!(app.count("tokens", doc! {}).await, 6 * 2);
}

/// The PaymentIntent's metadata names only part of the parameters (unusable) and its
/// event arrives first; the session's, complete, arrives with the same `created`: the
/// session's parameters are the ones to use, so the payment is issued from them.
#[tokio::test]
async fn a_session_issues_after_its_payment_intent_with_unusable_metadata() {
    let app = app().await;
    let created = now();
    let intent = intent_with(
        "evt_pi_partial",
        "succeeded",
        "pi_partial",
        created,
        json!({ "tokenmint_owner": OWNER }),
    );
    let receipt = json(deliver_stripe(&app, &intent).await).await;
    assert_ne!(receipt["outcome"], "issued", "{receipt}");
    let session = session_event(
        "evt_cs_partial",
        "completed",
        "pi_partial",
        "paid",
        created,
        token_metadata(3),
    );
    let receipt = json(deliver_stripe(&app, &session).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    issued_once(&app, "pi_partial", 3).await;
}

#[tokio::test]
async fn an_asynchronous_payment_is_issued_when_it_succeeds_later() {
    let app = app().await;
    let t = now();
    let completed = session_event(
        "evt_c",
        "completed",
        "pi_sepa",
        "unpaid",
        t,
        token_metadata(2),
    );
    let receipt = json(deliver_stripe(&app, &completed).await).await;
    assert_eq!(receipt["outcome"], "recorded", "{receipt}");
    assert_eq!(payment_status(&app, "pi_sepa").await.0, "processing");
    assert_eq!(app.count("tokens", doc! {}).await, 0, "not paid yet");
    let paid = session_event(
        "evt_p",
        "async_payment_succeeded",
        "pi_sepa",
        "paid",
        t + 86_400,
        token_metadata(2),
    );
    let receipt = json(deliver_stripe(&app, &paid).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    issued_once(&app, "pi_sepa", 2).await;
}

#[tokio::test]
async fn an_asynchronous_payment_that_fails_issues_nothing() {
    let app = app().await;
    let t = now();
    let completed = session_event(
        "evt_c",
        "completed",
        "pi_bank",
        "unpaid",
        t,
        token_metadata(2),
    );
    deliver_stripe(&app, &completed).await;
    let failed = session_event(
        "evt_f",
        "async_payment_failed",
        "pi_bank",
        "unpaid",
        t + 60,
        token_metadata(2),
    );
    let receipt = json(deliver_stripe(&app, &failed).await).await;
    assert_eq!(receipt["outcome"], "recorded", "{receipt}");
    assert_eq!(payment_status(&app, "pi_bank").await.0, "failed");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_problem(
        app.issue(ADMIN_KEY, &issuance_body("pi_bank", 2)).await,
        409,
        "payment_not_succeeded",
    )
    .await;
}

#[tokio::test]
async fn an_expired_session_cancels_its_payment() {
    let app = app().await;
    let t = now();
    let expired = session_event(
        "evt_x",
        "expired",
        "pi_gone",
        "unpaid",
        t,
        token_metadata(2),
    );
    deliver_stripe(&app, &expired).await;
    assert_eq!(payment_status(&app, "pi_gone").await.0, "canceled");
    let late = session_event(
        "evt_l",
        "completed",
        "pi_gone",
        "paid",
        t + 60,
        token_metadata(2),
    );
    let receipt = json(deliver_stripe(&app, &late).await).await;
    assert_eq!(receipt["outcome"], "terminal", "{receipt}");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn sessions_that_are_not_payments_are_ignored() {
    let app = app().await;
    let mut subscription = session_event(
        "evt_sub",
        "completed",
        "pi_sub",
        "paid",
        now(),
        token_metadata(2),
    );
    subscription["data"]["object"]["mode"] = json!("subscription");
    let mut no_intent = session_event(
        "evt_none",
        "expired",
        "pi_none",
        "unpaid",
        now(),
        token_metadata(2),
    );
    no_intent["data"]["object"]["payment_intent"] = Value::Null;
    for event in [subscription, no_intent] {
        let receipt = json(deliver_stripe(&app, &event).await).await;
        assert_eq!(receipt["outcome"], "ignored", "{receipt}");
        assert_eq!(
            recorded(&app, event["id"].as_str().unwrap()).await.0,
            "ignored"
        );
    }
    nothing_written(&app).await;
}

#[tokio::test]
async fn a_session_and_its_payment_intent_delivered_at_once_issue_once() {
    let app = app().await;
    let t = now();
    for n in 0..10 {
        let payment = format!("pi_race_{n}");
        // Alternately the parameters ride on the session or on the PaymentIntent.
        let (on_session, on_intent) = if n % 2 == 0 {
            (token_metadata(3), json!({}))
        } else {
            (json!({}), token_metadata(3))
        };
        let intent = intent_with(&format!("evt_pi_{n}"), "succeeded", &payment, t, on_intent);
        let session = session_event(
            &format!("evt_cs_{n}"),
            "completed",
            &payment,
            "paid",
            t + 1,
            on_session,
        );
        let (a, b) = tokio::join!(
            deliver_stripe(&app, &intent),
            deliver_stripe(&app, &session)
        );
        assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
        issued_once(&app, &payment, 3).await;
    }
}
