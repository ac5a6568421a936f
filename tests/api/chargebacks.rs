//! Chargebacks: Adyen `CHARGEBACK` takes the whole payment back; Stripe
//! `charge.dispute.funds_withdrawn` takes back the disputed amount, which adds to the
//! payment's refunds (kept under the dispute's own id).

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::adyen::{self, ADYEN, authorisation, modification};
use crate::helpers::*;
use crate::provider_events::{PROVIDERS, deliver_stripe, intent_event, partial_refund_event};

async fn app() -> TestApp {
    spawn_app_with(&format!("{PROVIDERS}{ADYEN}")).await
}

/// A Stripe Dispute whose funds were withdrawn: `amount` of payment `payment` disputed.
fn dispute(event_id: &str, dispute_id: &str, payment: &str, amount: i64) -> Value {
    json!({
        "id": event_id, "type": "charge.dispute.funds_withdrawn", "created": 1_780_000_500,
        "account": "acct_1",
        "data": { "object": {
            "id": dispute_id, "object": "dispute", "charge": "ch_1", "payment_intent": payment,
            "amount": amount, "currency": "eur", "reason": "fraudulent", "status": "needs_response",
        } },
    })
}

async fn stripe(app: &TestApp, event: &Value) -> Value {
    let answer = deliver_stripe(app, event).await;
    assert_eq!(answer.status(), 200);
    json(answer).await
}

async fn paid(app: &TestApp, payment: &str, quantity: &str) {
    let receipt = stripe(
        app,
        &intent_event("evt_paid", "succeeded", payment, 1_780_000_000, quantity),
    )
    .await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
}

async fn stored(app: &TestApp, payment: &str) -> Document {
    app.find_stored("payments", doc! { "paymentIntentId": payment })
        .await
}

#[tokio::test]
async fn an_adyen_chargeback_revokes_every_token() {
    let app = app().await;
    adyen::send(&app, &[authorisation("PSP_A", 3)]).await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1, 2]);
    // Disputed for less than the payment, a chargeback still takes it all back.
    adyen::send(&app, &[modification("CHARGEBACK", "CB_1", "PSP_A", 400)]).await;
    assert!(app.active_indexes("PSP_A").await.is_empty());
    let payment = stored(&app, "PSP_A").await;
    assert_eq!(payment.get_str("status").unwrap(), "refunded");
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "CHARGEBACK:CB_1:true" })
            .await,
        1
    );
}

#[tokio::test]
async fn a_stripe_dispute_of_part_of_the_payment_revokes_its_share() {
    let app = app().await;
    paid(&app, "pi_1", "4").await;
    let receipt = stripe(&app, &dispute("evt_d", "du_1", "pi_1", 250)).await;
    // floor(4 × 250 ÷ 1000) = 1, the highest tokenIndex.
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states("pi_1").await,
        vec![
            (0, "active".to_owned()),
            (1, "active".to_owned()),
            (2, "active".to_owned()),
            (3, "revoked".to_owned())
        ]
    );
    assert_eq!(
        stored(&app, "pi_1").await.get_str("status").unwrap(),
        "succeeded"
    );
}

#[tokio::test]
async fn a_dispute_adds_to_refunds_and_counts_once() {
    let app = app().await;
    paid(&app, "pi_1", "4").await;
    stripe(
        &app,
        &partial_refund_event("evt_r", "pi_1", 1_780_000_100, 1000, 250),
    )
    .await;
    stripe(&app, &dispute("evt_d", "du_1", "pi_1", 250)).await;
    // 250 refunded + 250 disputed of 1000: floor(4 × 500 ÷ 1000) = 2 revoked.
    assert_eq!(app.active_indexes("pi_1").await, vec![0, 1]);
    // The same dispute reported again by another event counts once.
    stripe(&app, &dispute("evt_d2", "du_1", "pi_1", 250)).await;
    assert_eq!(app.active_indexes("pi_1").await, vec![0, 1]);
    assert_eq!(
        stored(&app, "pi_1")
            .await
            .get_i64("amountRefunded")
            .unwrap(),
        500
    );
}

#[tokio::test]
async fn a_dispute_of_the_whole_amount_refunds_the_payment() {
    let app = app().await;
    paid(&app, "pi_1", "3").await;
    let receipt = stripe(&app, &dispute("evt_d", "du_1", "pi_1", 1000)).await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert!(
        app.token_states("pi_1")
            .await
            .iter()
            .all(|(_, status)| status == "revoked")
    );
    assert_eq!(
        stored(&app, "pi_1").await.get_str("status").unwrap(),
        "refunded"
    );
}

/// A dispute of the whole payment after a partial refund, then lost: Stripe gives back
/// only what the cardholder had been refunded already (`funds_reinstated`, the Dispute
/// `lost`, Stripe's "partially won"), money the customer keeps through the refund. No
/// token comes back: the merchant kept nothing. Won, the whole disputed amount comes
/// back, and so do the tokens the refund left.
#[tokio::test]
async fn a_dispute_lost_after_a_partial_refund_gives_no_token_back() {
    let app = app().await;
    for (payment, outcome, active) in [
        ("pi_lost", "lost", vec![]),
        ("pi_won", "won", vec![0, 1, 2, 3, 4, 5, 6]),
    ] {
        let receipt = stripe(
            &app,
            &intent_event(
                &format!("evt_paid_{payment}"),
                "succeeded",
                payment,
                1_780_000_000,
                "10",
            ),
        )
        .await;
        assert_eq!(receipt["outcome"], "issued", "{receipt}");
        stripe(
            &app,
            &partial_refund_event(
                &format!("evt_r_{payment}"),
                payment,
                1_780_000_100,
                1000,
                300,
            ),
        )
        .await;
        stripe(
            &app,
            &dispute(
                &format!("evt_d_{payment}"),
                &format!("du_{payment}"),
                payment,
                1000,
            ),
        )
        .await;
        assert!(app.active_indexes(payment).await.is_empty());

        let mut reinstated = dispute(
            &format!("evt_back_{payment}"),
            &format!("du_{payment}"),
            payment,
            1000,
        );
        reinstated["type"] = json!("charge.dispute.funds_reinstated");
        reinstated["created"] = json!(1_780_000_900);
        reinstated["data"]["object"]["status"] = json!(outcome);
        stripe(&app, &reinstated).await;

        assert_eq!(app.active_indexes(payment).await, active, "{payment}");
        let expected = if active.is_empty() {
            "refunded"
        } else {
            "succeeded"
        };
        assert_eq!(
            stored(&app, payment).await.get_str("status"),
            Ok(expected),
            "{payment}"
        );
    }
}

/// A dispute carries its evidence text (up to 150,000 characters at Stripe), past the
/// 64 KiB a client's request may send: the webhook route reads up to
/// `webhooks.body_limit_bytes`, so the chargeback is applied rather than refused 413 on
/// every redelivery. Past that limit it is 413 and nothing is recorded, and the client
/// routes keep their own limit.
#[tokio::test]
async fn a_dispute_carrying_its_evidence_is_read_past_a_requests_limit() {
    let app = app().await;
    paid(&app, "pi_1", "4").await;
    let with_evidence = |event_id: &str, characters: usize| {
        let mut event = dispute(event_id, "du_1", "pi_1", 250);
        event["data"]["object"]["evidence"] =
            json!({ "uncategorized_text": "x".repeat(characters) });
        event
    };

    let too_large = with_evidence("evt_huge", 600_000);
    let answer = deliver_stripe(&app, &too_large).await;
    assert_eq!(answer.status(), 413);
    assert_eq!(
        app.count("webhook_events", doc! {}).await,
        1,
        "the success alone"
    );
    assert_eq!(app.active_indexes("pi_1").await, vec![0, 1, 2, 3]);

    let event = with_evidence("evt_d", 150_000);
    assert!(event.to_string().len() > 65_536);
    let receipt = stripe(&app, &event).await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(app.active_indexes("pi_1").await, vec![0, 1, 2]);

    let request = json!({ "paymentIntentId": "p".repeat(100_000) }).to_string();
    let refused = app.issue_raw("application/json", request).await;
    assert_eq!(refused.status(), 413);
}
