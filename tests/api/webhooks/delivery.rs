//! Each event has one effect: a success issues once, a duplicate or a second event for
//! the same payment changes nothing, an older event never regresses the state, and
//! concurrent deliveries agree.

use futures::future::join_all;
use mongodb::bson::doc;

use crate::helpers::*;
use crate::provider_events::*;

#[tokio::test]
async fn a_succeeded_payment_issues_its_tokens_once() {
    let app = app().await;
    let event = intent_event("evt_1", "succeeded", "pi_wh", now(), "3");
    let first = deliver_stripe(&app, &event).await;
    assert_eq!(first.status(), 200);
    let receipt = json(first).await;
    assert_eq!(receipt["outcome"], "issued");
    assert_eq!(receipt["tokensCreated"], 3);
    assert_eq!(app.token_indexes("pi_wh").await, vec![0, 1, 2]);
    let record = app.find_stored("issuances", doc! {}).await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_str("accountId").unwrap(), "acct_1");

    // The same event again: 200, duplicate, nothing more.
    let again = json(deliver_stripe(&app, &event).await).await;
    assert_eq!(again["duplicate"], true);
    // Another event id for the same payment: nothing more either.
    let other = intent_event("evt_2", "succeeded", "pi_wh", now() + 1, "3");
    let other = json(deliver_stripe(&app, &other).await).await;
    assert_eq!(other["outcome"], "already_issued");
    assert_eq!(app.count("tokens", doc! {}).await, 3);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("webhook_events", doc! {}).await, 2);

    let payment = json(
        app.get(READER_KEY, "/v1/payments/stripe/acct_1/pi_wh")
            .await,
    )
    .await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["quantity"], 3);
    assert!(payment["version"].as_i64().unwrap() > 0);
}

#[tokio::test]
async fn out_of_order_events_never_regress_the_state() {
    let app = app().await;
    let t = now();
    // succeeded (later) arrives before processing (earlier): stays succeeded.
    deliver_stripe(&app, &intent_event("evt_s", "succeeded", "pi_ooo", t, "1")).await;
    let late = json(
        deliver_stripe(
            &app,
            &intent_event("evt_p", "processing", "pi_ooo", t - 60, "1"),
        )
        .await,
    )
    .await;
    assert_eq!(late["outcome"], "stale");
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "succeeded");
    // A processing event with a LATER timestamp still cannot undo succeeded (rank first).
    deliver_stripe(
        &app,
        &intent_event("evt_p2", "processing", "pi_ooo", t + 60, "1"),
    )
    .await;
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "succeeded");
    // refunded is not undone by a late succeeded.
    deliver_stripe(&app, &refund_event("evt_r", "pi_ooo", t + 100)).await;
    deliver_stripe(
        &app,
        &intent_event("evt_s2", "succeeded", "pi_ooo", t + 200, "1"),
    )
    .await;
    assert_eq!(payment_status(&app, "pi_ooo").await.0, "refunded");
    assert_eq!(app.count("tokens", doc! { "status": "revoked" }).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 1);

    // Standard Webhooks: version 5 then 3 stays 5.
    send_acme(&app, "msg_5", &acme_event("processing", "pay_v", 5)).await;
    let stale = json(send_acme(&app, "msg_3", &acme_event("succeeded", "pay_v", 3)).await).await;
    assert_eq!(stale["outcome"], "stale");
    assert_eq!(
        payment_status(&app, "pay_v").await,
        ("processing".to_owned(), 5)
    );
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pay_v" })
            .await,
        0,
        "a stale success issues nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_versions_the_highest_wins() {
    let app = app().await;
    let deliveries = (1..=20).map(|v| {
        let app = &app;
        async move {
            send_acme(
                app,
                &format!("msg_c{v}"),
                &acme_event("processing", "pay_c", v),
            )
            .await
            .status()
            .as_u16()
        }
    });
    let statuses = join_all(deliveries).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(payment_status(&app, "pay_c").await.1, 20);
    assert_eq!(app.count("payments", doc! {}).await, 1);
    assert_eq!(app.count("webhook_events", doc! {}).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_deliveries_have_one_effect() {
    let app = app().await;
    let event = intent_event("evt_dup", "succeeded", "pi_dup", now(), "5");
    let answers = join_all((0..16).map(|_| deliver_stripe(&app, &event))).await;
    assert!(answers.iter().all(|r| r.status() == 200));
    assert_eq!(app.token_indexes("pi_dup").await, vec![0, 1, 2, 3, 4]);
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(
        app.count("webhook_events", doc! { "eventId": "evt_dup" })
            .await,
        1
    );
}

/// An older success that carries the amount a newer one did not still fills it in, so a
/// later partial refund takes its share of it rather than reading as a refund of
/// everything (the parameters being fixed already does not stop the amount).
#[tokio::test]
async fn an_older_success_fills_in_the_amount_a_newer_one_lacked() {
    let app = app().await;
    let newer = acme_event("succeeded", "pay_gap", 3);
    assert_eq!(send_acme(&app, "msg_newer", &newer).await.status(), 200);
    let mut older = acme_event("succeeded", "pay_gap", 2);
    older["data"]["amount"] = serde_json::json!(1000);
    older["data"]["currency"] = serde_json::json!("EUR");
    assert_eq!(send_acme(&app, "msg_older", &older).await.status(), 200);
    let stored = app
        .find_stored("payments", doc! { "paymentIntentId": "pay_gap" })
        .await;
    assert_eq!(stored.get_i64("amount").ok(), Some(1000), "{stored}");
    let mut refund = acme_event("refunded", "pay_gap", 4);
    refund["data"]["amountRefunded"] = serde_json::json!(500);
    assert_eq!(send_acme(&app, "msg_refund", &refund).await.status(), 200);
    let active = app.active_indexes("pay_gap").await;
    assert_eq!(active.len(), 1, "half of two tokens stands");
}
