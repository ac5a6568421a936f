//! A partial refund whatever the order: recorded before the tokens are written (they are
//! written with the refunded share already revoked), or after a trusted backend issued
//! them without any provider metadata.

use mongodb::bson::doc;
use serde_json::json;

use super::{acme, acme_paid, payment_doc, revoked_in, stripe};
use crate::helpers::*;
use crate::provider_events::*;

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
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(500));
    let paid = stripe(
        &app,
        &intent_event("evt_pre_ok", "succeeded", "pi_pre", t, "4"),
    )
    .await;
    assert_eq!(paid["outcome"], "issued", "{paid}");
    assert_eq!(paid["tokensCreated"], 4, "{paid}");
    assert_eq!(
        app.token_states("pi_pre").await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
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
        .find_stored("issuances", doc! { "paymentIntentId": "pi_pre" })
        .await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(stored_int(&record, "quantity"), Some(4));

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
    assert_eq!(
        answered,
        indexed_statuses(&["active", "active", "active", "revoked"])
    );
    assert_eq!(
        app.token_states("pi_pre_w").await,
        indexed_statuses(&["active", "active", "active", "revoked"])
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
        indexed_statuses(&["active", "active", "revoked", "revoked"])
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
        indexed_statuses(&["active", "active", "active", "revoked"])
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
        indexed_statuses(&["active", "active", "active", "revoked"])
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
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
    let payment = payment_doc(&app, "pi_backend").await;
    assert!(
        !payment.contains_key("status"),
        "a partial refund reports no status of its own: {payment}"
    );
    assert_eq!(stored_int(&payment, "amountRefunded"), Some(500));
    // The backend's retry replays the set as it now stands, and writes nothing.
    let replay = app.issue(WRITER_KEY, &issuance_body("pi_backend", 4)).await;
    assert_eq!(replay.status(), 200);
    let body = json(replay).await;
    assert_eq!(body["created"], 0);
    assert_eq!(body["tokens"][3]["status"], "revoked");
    assert_eq!(
        app.token_states("pi_backend").await,
        indexed_statuses(&["active", "active", "revoked", "revoked"])
    );
}
