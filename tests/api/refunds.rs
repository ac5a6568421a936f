//! Partial refunds: a refund of part of a payment takes back floor(quantity × refunded ÷
//! amount) of its tokens, highest tokenIndex first, active ones only (redeemed ones stay
//! redeemed and are the shortfall); the payment keeps standing for the rest. Stripe
//! (`charge.refunded` with `refunded: false`) and Standard Webhooks (`payment.refunded`
//! with `data.amountRefunded`).

use mongodb::bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::provider_events::*;

/// A stored integer, whichever BSON width it was written with.
fn int(doc: &Document, field: &str) -> Option<i64> {
    match doc.get(field)? {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        other => panic!("{field} is not an integer: {other:?}"),
    }
}

/// `statuses[i]` is the expected status of tokenIndex i.
fn expect(statuses: &[&str]) -> Vec<(i64, String)> {
    statuses
        .iter()
        .enumerate()
        .map(|(i, s)| (i as i64, (*s).to_owned()))
        .collect()
}

async fn payment_doc(app: &TestApp, payment: &str) -> Document {
    app.db
        .collection::<Document>("payments")
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no payment document for {payment}"))
}

async fn event_record(app: &TestApp, provider: &str, event_id: &str) -> Document {
    app.db
        .collection::<Document>("webhook_events")
        .find_one(doc! { "provider": provider, "eventId": event_id })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("event {event_id} was not recorded"))
}

/// How many tokens a receipt says were revoked (absent: none).
fn revoked_in(receipt: &Value) -> u64 {
    receipt
        .get("tokensRevoked")
        .map_or(0, |n| n.as_u64().expect("tokensRevoked is a count"))
}

async fn stripe(app: &TestApp, event: &Value) -> Value {
    let response = send_stripe(app, event, STRIPE_NEW, now()).await;
    assert_eq!(response.status(), 200, "{event}");
    let receipt = json(response).await;
    assert_eq!(receipt["duplicate"], false, "{receipt}");
    receipt
}

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

/// A Standard Webhooks `payment.refunded`, without the payment's metadata; partial when
/// `amount_refunded` is given.
fn acme_refund(payment: &str, version: i64, amount_refunded: Option<i64>) -> Value {
    let mut data = json!({ "paymentIntentId": payment, "version": version });
    if let Some(refunded) = amount_refunded {
        data["amountRefunded"] = json!(refunded);
    }
    json!({ "type": "payment.refunded", "timestamp": "2026-11-30T00:00:00Z", "data": data })
}

async fn redeem(app: &TestApp, token_id: &str) {
    let response = app
        .http
        .post(app.url(&format!("/v1/tokens/{token_id}/redeem")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "redeem {token_id}");
}

/// The token ids of a stripe/acct_1 payment, in tokenIndex order.
async fn ids(app: &TestApp, payment: &str) -> Vec<String> {
    let response = app
        .get(ADMIN_KEY, &format!("/v1/issuances/stripe/acct_1/{payment}"))
        .await;
    assert_eq!(response.status(), 200);
    token_ids(&json(response).await)
}

#[tokio::test]
async fn stripe_partial_refunds_take_back_the_refunded_share_highest_index_first() {
    let app = app().await;
    let t = now();
    let pi = "pi_partial";
    let paid = stripe(&app, &intent_event("evt_paid", "succeeded", pi, t, "4")).await;
    assert_eq!(paid["tokensCreated"], 4);

    // 250 of 1000 refunded: floor(4 × 250 ÷ 1000) = 1 token back, the highest index.
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_r250", pi, t + 10, 1000, 250),
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(receipt["shortfall"], 0, "{receipt}");
    assert_eq!(
        app.token_states(pi).await,
        expect(&["active", "active", "active", "revoked"])
    );
    let revoked = &app.tokens_of(pi).await[3];
    assert_eq!(
        revoked.get_str("revocationReason").unwrap(),
        "partial_refund"
    );
    assert!(revoked.get_datetime("revokedAt").is_ok());
    assert_eq!(int(revoked, "_version"), Some(1));
    let payment = payment_doc(&app, pi).await;
    assert_eq!(
        payment.get_str("status").unwrap(),
        "succeeded",
        "the payment still stands for the rest"
    );
    assert_eq!(int(&payment, "amountRefunded"), Some(250));
    let record = event_record(&app, "stripe", "evt_r250").await;
    assert_eq!(record.get_str("outcome").unwrap(), "revoked");
    assert_eq!(int(&record, "tokensRevoked"), Some(1));
    assert_eq!(int(&record, "shortfall"), Some(0));

    // 500 of 1000 so far: 2 back in all, so one more.
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_r500", pi, t + 20, 1000, 500),
    )
    .await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pi).await,
        expect(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        int(&payment_doc(&app, pi).await, "amountRefunded"),
        Some(500)
    );

    // The same refund again under a new event id, and an older, smaller one delivered
    // late: nothing more is taken back, and the refunded amount does not shrink.
    let again = stripe(
        &app,
        &partial_refund_event("evt_r500_again", pi, t + 30, 1000, 500),
    )
    .await;
    assert_eq!(revoked_in(&again), 0, "{again}");
    let older = stripe(
        &app,
        &partial_refund_event("evt_r100_old", pi, t + 5, 1000, 100),
    )
    .await;
    assert_eq!(revoked_in(&older), 0, "{older}");
    assert_eq!(
        app.token_states(pi).await,
        expect(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": pi, "status": "revoked", "_version": 1 }
        )
        .await,
        2,
        "no token was written twice"
    );
    let payment = payment_doc(&app, pi).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(int(&payment, "amountRefunded"), Some(500));
    for event in ["evt_r500_again", "evt_r100_old"] {
        let record = event_record(&app, "stripe", event).await;
        assert_eq!(int(&record, "tokensRevoked").unwrap_or(0), 0, "{record}");
    }

    // The full refund takes back the rest.
    let full = stripe(&app, &refund_event("evt_full", pi, t + 40)).await;
    assert_eq!(full["outcome"], "revoked", "{full}");
    assert_eq!(full["tokensRevoked"], 2, "{full}");
    assert_eq!(
        app.token_states(pi).await,
        expect(&["revoked", "revoked", "revoked", "revoked"])
    );
    assert_eq!(
        payment_doc(&app, pi).await.get_str("status").unwrap(),
        "refunded"
    );
    assert_eq!(
        app.count("tokens", doc! {}).await,
        4,
        "nothing issued again"
    );
    assert_eq!(app.count("webhook_events", doc! {}).await, 6);
}

#[tokio::test]
async fn standard_webhooks_partial_refunds_use_the_known_amount_and_round_down() {
    let app = app().await;
    let pay = "pay_partial";
    let paid = acme(&app, "msg_paid", &acme_paid(pay, 1, 1000, 3)).await;
    assert_eq!(paid["tokensCreated"], 3, "{paid}");

    // 500 of 1000 (the amount the success event named): floor(3 × 0.5) = 1.
    let receipt = acme(&app, "msg_r500", &acme_refund(pay, 2, Some(500))).await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pay).await,
        expect(&["active", "active", "revoked"])
    );
    let payment = payment_doc(&app, pay).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(int(&payment, "amountRefunded"), Some(500));
    assert_eq!(
        int(&payment, "version"),
        Some(1),
        "a partial refund is no state change: it consumes no version"
    );

    // 700 of 1000: floor(2.1) = 2 in all.
    let receipt = acme(&app, "msg_r700", &acme_refund(pay, 3, Some(700))).await;
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(
        app.token_states(pay).await,
        expect(&["active", "revoked", "revoked"])
    );

    // Repeated (newer version, same amount) and older (lower version, lower amount):
    // nothing more.
    let again = acme(&app, "msg_r700_again", &acme_refund(pay, 4, Some(700))).await;
    assert_eq!(revoked_in(&again), 0, "{again}");
    let older = acme(&app, "msg_r500_old", &acme_refund(pay, 2, Some(500))).await;
    assert_eq!(revoked_in(&older), 0, "{older}");
    assert_eq!(
        app.token_states(pay).await,
        expect(&["active", "revoked", "revoked"])
    );
    let payment = payment_doc(&app, pay).await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert_eq!(int(&payment, "amountRefunded"), Some(700));

    // A refund without amountRefunded is the full one: the last token goes too.
    let full = acme(&app, "msg_full", &acme_refund(pay, 5, None)).await;
    assert_eq!(full["tokensRevoked"], 1, "{full}");
    assert_eq!(
        app.token_states(pay).await,
        expect(&["revoked", "revoked", "revoked"])
    );
    assert_eq!(
        payment_doc(&app, pay).await.get_str("status").unwrap(),
        "refunded"
    );
}

#[tokio::test]
async fn redeemed_tokens_of_the_refunded_share_stay_redeemed_and_are_the_shortfall() {
    let app = app().await;
    let t = now();

    // The highest token redeemed: the share of 2 revokes index 2 only, index 3 is short.
    stripe(
        &app,
        &intent_event("evt_a", "succeeded", "pi_short1", t, "4"),
    )
    .await;
    let a = ids(&app, "pi_short1").await;
    redeem(&app, &a[3]).await;
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_a_r", "pi_short1", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 1, "{receipt}");
    assert_eq!(receipt["shortfall"], 1, "{receipt}");
    assert_eq!(
        app.token_states("pi_short1").await,
        expect(&["active", "active", "revoked", "redeemed"])
    );
    let record = event_record(&app, "stripe", "evt_a_r").await;
    assert_eq!(record.get_str("outcome").unwrap(), "revoked");
    assert_eq!(int(&record, "tokensRevoked"), Some(1));
    assert_eq!(int(&record, "shortfall"), Some(1));

    // The whole share redeemed: nothing revoked, both short, and the lower tokens are not
    // taken instead.
    stripe(
        &app,
        &intent_event("evt_b", "succeeded", "pi_short2", t, "4"),
    )
    .await;
    let b = ids(&app, "pi_short2").await;
    redeem(&app, &b[2]).await;
    redeem(&app, &b[3]).await;
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_b_r", "pi_short2", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(revoked_in(&receipt), 0, "{receipt}");
    assert_eq!(receipt["shortfall"], 2, "{receipt}");
    assert_eq!(
        app.token_states("pi_short2").await,
        expect(&["active", "active", "redeemed", "redeemed"])
    );
    let record = event_record(&app, "stripe", "evt_b_r").await;
    assert_eq!(int(&record, "tokensRevoked").unwrap_or(0), 0);
    assert_eq!(int(&record, "shortfall"), Some(2));

    // The full refund after the partial one takes the rest; redeemed ones stay redeemed.
    let full = stripe(&app, &refund_event("evt_a_full", "pi_short1", t + 20)).await;
    assert_eq!(full["tokensRevoked"], 2, "{full}");
    assert_eq!(full["shortfall"], 1, "{full}");
    assert_eq!(
        app.token_states("pi_short1").await,
        expect(&["revoked", "revoked", "revoked", "redeemed"])
    );
    assert_eq!(
        payment_doc(&app, "pi_short1")
            .await
            .get_str("status")
            .unwrap(),
        "refunded"
    );
    // The other payment was not touched.
    assert_eq!(
        app.token_states("pi_short2").await,
        expect(&["active", "active", "redeemed", "redeemed"])
    );
}

#[tokio::test]
async fn a_partial_refund_recorded_before_issuance_is_taken_back_as_the_tokens_are_written() {
    let app = app().await;
    let t = now();

    // Stripe: the partial refund arrives before the success event.
    let early = stripe(
        &app,
        &partial_refund_event("evt_pre_r", "pi_pre", t + 10, 1000, 500),
    )
    .await;
    assert_eq!(revoked_in(&early), 0, "{early}");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let payment = payment_doc(&app, "pi_pre").await;
    assert!(
        !payment.contains_key("status"),
        "a partial refund reports no status of its own: {payment}"
    );
    assert_eq!(int(&payment, "amountRefunded"), Some(500));
    let paid = stripe(
        &app,
        &intent_event("evt_pre_ok", "succeeded", "pi_pre", t, "4"),
    )
    .await;
    assert_eq!(paid["outcome"], "issued", "{paid}");
    assert_eq!(paid["tokensCreated"], 4, "{paid}");
    assert_eq!(
        app.token_states("pi_pre").await,
        expect(&["active", "active", "revoked", "revoked"])
    );
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_pre", "revocationReason": "partial_refund" }
        )
        .await,
        2
    );
    let record = app
        .db
        .collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": "pi_pre" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(int(&record, "quantity"), Some(4));

    // A trusted backend issuing after the partial refund: the answer already shows the
    // refunded share revoked.
    stripe(
        &app,
        &partial_refund_event("evt_pre_w_r", "pi_pre_w", t + 10, 1000, 250),
    )
    .await;
    let response = app.issue(WRITER_KEY, &issuance_body("pi_pre_w", 4)).await;
    assert_eq!(response.status(), 201);
    let body = json(response).await;
    let answered: Vec<(i64, String)> = body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tokenIndex"].as_i64().unwrap(),
                t["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(answered, expect(&["active", "active", "active", "revoked"]));
    assert_eq!(
        app.token_states("pi_pre_w").await,
        expect(&["active", "active", "active", "revoked"])
    );

    // The same in atomic mode.
    stripe(
        &app,
        &partial_refund_event("evt_pre_a_r", "pi_pre_a", t + 10, 1000, 500),
    )
    .await;
    let mut atomic = issuance_body("pi_pre_a", 4);
    atomic["mode"] = json!("atomic");
    assert_eq!(app.issue(WRITER_KEY, &atomic).await.status(), 201);
    assert_eq!(
        app.token_states("pi_pre_a").await,
        expect(&["active", "active", "revoked", "revoked"])
    );

    // A checkout's pending request, then the partial refund, then the success event that
    // fulfils the request.
    assert_eq!(
        app.issue(REQUEST_KEY, &issuance_body("pi_pre_c", 4))
            .await
            .status(),
        202
    );
    stripe(
        &app,
        &partial_refund_event("evt_pre_c_r", "pi_pre_c", t + 10, 1000, 250),
    )
    .await;
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pi_pre_c" })
            .await,
        0
    );
    let paid = stripe(
        &app,
        &intent_event("evt_pre_c_ok", "succeeded", "pi_pre_c", t, "4"),
    )
    .await;
    assert_eq!(paid["tokensCreated"], 4, "{paid}");
    assert_eq!(
        app.token_states("pi_pre_c").await,
        expect(&["active", "active", "active", "revoked"])
    );

    // Standard Webhooks: the refund names the amount itself, the success comes later.
    acme(
        &app,
        "msg_pre_r",
        &json!({ "type": "payment.refunded", "timestamp": "2026-11-30T00:00:00Z",
            "data": { "paymentIntentId": "pay_pre", "version": 2, "amount": 1000, "amountRefunded": 250 } }),
    )
    .await;
    assert!(!payment_doc(&app, "pay_pre").await.contains_key("status"));
    let paid = acme(&app, "msg_pre_ok", &acme_paid("pay_pre", 1, 1000, 4)).await;
    assert_eq!(paid["tokensCreated"], 4, "{paid}");
    assert_eq!(
        app.token_states("pay_pre").await,
        expect(&["active", "active", "active", "revoked"])
    );
}

#[tokio::test]
async fn a_partial_refund_of_tokens_a_trusted_backend_issued_takes_back_its_share() {
    let app = app().await;
    // No tokenmint metadata at the provider: the backend issued, the refund still settles.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_backend", 4))
            .await
            .status(),
        201
    );
    let receipt = stripe(
        &app,
        &partial_refund_event("evt_backend_r", "pi_backend", now(), 1000, 500),
    )
    .await;
    assert_eq!(receipt["outcome"], "revoked", "{receipt}");
    assert_eq!(receipt["tokensRevoked"], 2, "{receipt}");
    assert_eq!(
        app.token_states("pi_backend").await,
        expect(&["active", "active", "revoked", "revoked"])
    );
    let payment = payment_doc(&app, "pi_backend").await;
    assert!(
        !payment.contains_key("status"),
        "a partial refund reports no status of its own: {payment}"
    );
    assert_eq!(int(&payment, "amountRefunded"), Some(500));
    // The backend's retry replays the set as it now stands, and writes nothing.
    let replay = app.issue(WRITER_KEY, &issuance_body("pi_backend", 4)).await;
    assert_eq!(replay.status(), 200);
    let body = json(replay).await;
    assert_eq!(body["created"], 0);
    assert_eq!(body["tokens"][3]["status"], "revoked");
    assert_eq!(
        app.token_states("pi_backend").await,
        expect(&["active", "active", "revoked", "revoked"])
    );
}

/// Stripe `created` has a one-second resolution: a full refund in the same second as the
/// last partial one must still win (it outranks a partial refund, and reports the whole
/// amount refunded).
#[tokio::test]
async fn a_full_refund_in_the_same_second_as_a_partial_one_still_takes_back_the_rest() {
    let app = app().await;
    let t = now();
    let pi = "pi_same_second";
    stripe(&app, &intent_event("evt_ss", "succeeded", pi, t, "4")).await;
    stripe(
        &app,
        &partial_refund_event("evt_ss_r", pi, t + 10, 1000, 500),
    )
    .await;
    let full = stripe(&app, &refund_event("evt_ss_full", pi, t + 10)).await;
    assert_eq!(full["tokensRevoked"], 2, "{full}");
    assert_eq!(
        app.token_states(pi).await,
        expect(&["revoked", "revoked", "revoked", "revoked"])
    );
    assert_eq!(
        payment_doc(&app, pi).await.get_str("status").unwrap(),
        "refunded"
    );
}
