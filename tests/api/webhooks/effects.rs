//! What an event does: a refund revokes only the active tokens, bad metadata and
//! ignored events are answered 200 and recorded, and a checkout request waits for the
//! payment and is completed by its success event, once.

use mongodb::bson::{doc, oid::ObjectId};
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_refund_after_partial_redemption_revokes_only_active_tokens() {
    let app = app().await;
    let t = now();
    let receipt =
        json(deliver_stripe(&app, &intent_event("evt_ok", "succeeded", "pi_ref", t, "4")).await)
            .await;
    assert_eq!(receipt["tokensCreated"], 4);
    let issued = json(
        app.get(ADMIN_KEY, "/v1/issuances/stripe/acct_1/pi_ref")
            .await,
    )
    .await;
    let ids = token_ids(&issued);
    for id in &ids[..2] {
        let redeemed = app.redeem_token(ADMIN_KEY, id).await;
        assert_eq!(redeemed.status(), 200);
    }
    let receipt =
        json(deliver_stripe(&app, &refund_event("evt_refund", "pi_ref", t + 10)).await).await;
    assert_eq!(receipt["outcome"], "revoked");
    assert_eq!(receipt["tokensRevoked"], 2);
    assert_eq!(
        receipt["shortfall"], 2,
        "the redeemed ones are the shortfall"
    );
    assert_eq!(app.count("tokens", doc! { "status": "redeemed" }).await, 2);
    assert_eq!(
        app.count("tokens", doc! { "status": "revoked", "_version": 1 })
            .await,
        2
    );
    let event = app
        .find_stored("webhook_events", doc! { "eventId": "evt_refund" })
        .await;
    assert_eq!(event.get_str("outcome").unwrap(), "revoked");
}

#[tokio::test]
async fn bad_metadata_and_ignored_events_answer_200_and_are_recorded() {
    let app = app().await;
    let mut event = intent_event("evt_meta", "succeeded", "pi_meta", now(), "lots");
    event["data"]["object"]["metadata"]["tokenmint_owner"] = json!("not-an-id");
    let receipt = json(deliver_stripe(&app, &event).await).await;
    assert_eq!(receipt["outcome"], "metadata_invalid");
    assert!(
        receipt["detail"]
            .as_str()
            .unwrap()
            .contains("tokenmint_quantity")
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let payment = json(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_meta")
            .await,
    )
    .await;
    assert!(
        payment["metadataError"]
            .as_str()
            .unwrap()
            .contains("tokenmint_owner")
    );

    let other = json!({"id": "evt_cust", "type": "customer.created", "created": now(), "data": {"object": {"id": "cus_1"}}});
    let receipt = json(deliver_stripe(&app, &other).await).await;
    assert_eq!(receipt["outcome"], "ignored");
    let refund_unknown =
        json(deliver_stripe(&app, &refund_event("evt_unknown", "pi_never_seen", now())).await)
            .await;
    assert_eq!(refund_unknown["tokensRevoked"], 0);
    assert_eq!(
        app.count("webhook_events", doc! { "outcome": "ignored" })
            .await,
        1
    );
    assert_problem(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_nothing")
            .await,
        404,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn checkout_requests_wait_for_the_payment_then_complete_once() {
    let app = app().await;
    let body = issuance_body("pi_trust", 3);
    // Unknown payment: 202, a pending issuance, no tokens.
    let pending = app.issue(REQUEST_KEY, &body).await;
    assert_eq!(pending.status(), 202);
    let pending = json(pending).await;
    assert_eq!(pending["issuance"]["status"], "pending");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(
        app.issue(REQUEST_KEY, &body).await.status(),
        202,
        "asking again is still pending"
    );

    // The success webhook completes it, exactly once.
    let receipt = json(
        deliver_stripe(
            &app,
            &intent_event("evt_t", "succeeded", "pi_trust", now(), "3"),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(app.token_indexes("pi_trust").await, vec![0, 1, 2]);
    let record = app.find_stored("issuances", doc! {}).await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    // The frontend's next request now replays.
    let done = app.issue(REQUEST_KEY, &body).await;
    assert_eq!(done.status(), 200);
    assert_eq!(token_ids(&json(done).await).len(), 3);

    // Payment known to have succeeded first: the frontend's request issues at once.
    deliver_stripe(
        &app,
        &intent_event("evt_t2", "succeeded", "pi_trust2", now(), "2"),
    )
    .await;
    let mut mismatch = issuance_body("pi_trust2", 5);
    assert_hidden_conflict(app.issue(REQUEST_KEY, &mismatch).await).await;
    mismatch["quantity"] = json!(2);
    assert_eq!(
        app.issue(REQUEST_KEY, &mismatch).await.status(),
        200,
        "the webhook issued already"
    );

    // Canceled payment: 409 payment_not_succeeded, nothing written.
    deliver_stripe(
        &app,
        &intent_event("evt_c", "canceled", "pi_canceled", now(), "1"),
    )
    .await;
    assert_problem(
        app.issue(REQUEST_KEY, &issuance_body("pi_canceled", 1))
            .await,
        409,
        "payment_not_succeeded",
    )
    .await;
    assert_eq!(
        app.count_records(doc! { "paymentIntentId": "pi_canceled" })
            .await,
        0
    );

    // A pending request whose parameters differ from the payment's metadata: the signed
    // metadata wins, and the checkout's own request is then refused without being shown
    // the recorded values.
    let mut asked = issuance_body("pi_trust3", 9);
    asked["owner"] = json!(OTHER_OWNER);
    assert_eq!(app.issue(REQUEST_KEY, &asked).await.status(), 202);
    let receipt = json(
        deliver_stripe(
            &app,
            &intent_event("evt_t3", "succeeded", "pi_trust3", now(), "2"),
        )
        .await,
    )
    .await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(receipt["tokensCreated"], 2);
    assert_eq!(app.token_indexes("pi_trust3").await, vec![0, 1]);
    assert_eq!(
        app.count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_trust3", "owner": ObjectId::parse_str(OWNER).unwrap() }
        )
        .await,
        2,
        "the tokens belong to the owner the provider named"
    );
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": "pi_trust3" })
        .await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_i64("quantity").unwrap(), 2);
    assert!(!record.contains_key("expiresAt"), "no longer pending");
    assert_hidden_conflict(app.issue(REQUEST_KEY, &asked).await).await;
}

#[tokio::test]
async fn parameters_an_earlier_event_named_are_issued_only_if_the_success_pays_for_them() {
    // Tokens cost 100 cents each. A processing event names 10 for 1000; the success
    // names none, for 100: the parameters on the payment are checked against what it
    // stands for now, not against the event that named them.
    let app = spawn_app_with(&format!(
        "{PROVIDERS}\n[issuance.token_prices.standard]\nEUR = 100\n"
    ))
    .await;
    let mut processing = acme_event("processing", "pay_less", 1);
    processing["data"]["quantity"] = json!(10);
    processing["data"]["amount"] = json!(1000);
    processing["data"]["currency"] = json!("EUR");
    assert_eq!(
        send_acme(&app, "msg_less_1", &processing).await.status(),
        200
    );
    let mut success = acme_event("succeeded", "pay_less", 2);
    let data = success["data"].as_object_mut().unwrap();
    for field in ["owner", "tokenType", "quantity"] {
        data.remove(field);
    }
    data.insert("amount".to_owned(), json!(100));
    data.insert("currency".to_owned(), json!("EUR"));
    let receipt = json(send_acme(&app, "msg_less_2", &success).await).await;
    assert_eq!(receipt["outcome"], "metadata_invalid", "{receipt}");
    assert!(
        receipt["detail"].as_str().unwrap().contains("cost 1000"),
        "{receipt}"
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count("issuances", doc! {}).await, 0);
    // Nor does a checkout's request for them.
    let mut body = issuance_body("pay_less", 10);
    body["provider"] = json!("acme");
    body["accountId"] = json!("default");
    let checkout = app.issue(REQUEST_KEY, &body).await;
    assert_eq!(checkout.status(), 409, "{}", json(checkout).await);
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Paid for in full, the same parameters issue.
    let mut paid = acme_event("processing", "pay_full", 1);
    paid["data"]["quantity"] = json!(10);
    paid["data"]["amount"] = json!(1000);
    paid["data"]["currency"] = json!("EUR");
    assert_eq!(send_acme(&app, "msg_full_1", &paid).await.status(), 200);
    let mut success = acme_event("succeeded", "pay_full", 2);
    let data = success["data"].as_object_mut().unwrap();
    for field in ["owner", "tokenType", "quantity"] {
        data.remove(field);
    }
    let receipt = json(send_acme(&app, "msg_full_2", &success).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(app.token_indexes("pay_full").await.len(), 10);
}
