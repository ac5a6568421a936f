//! Reversals at Adyen (`CHARGEBACK_REVERSED`, `REFUND_FAILED`, `REFUNDED_REVERSED`),
//! Paddle (`chargeback_reverse` adjustments) and Standard Webhooks
//! (`payment.reinstated`), from their documented notification shapes; and what an Adyen
//! item signed once but sent again with its unsigned fields changed can do (nothing).

use mongodb::bson::{Document, doc};
use serde_json::json;

use super::{payment, payment_status, statuses, verify_clean};
use crate::adyen::{self, ADYEN, authorisation, modification};
use crate::helpers::*;
use crate::paddle::{self, PADDLE};
use crate::provider_events::{PROVIDERS, send_acme};

/// Forgets that Adyen's item `event_id` was processed, as the dedupe record's expiry does.
async fn expire(app: &TestApp, event_id: &str) {
    app.db
        .collection::<Document>("webhook_events")
        .delete_one(doc! { "eventId": event_id })
        .await
        .unwrap();
}

/// Adyen's `CHARGEBACK_REVERSED` of chargeback `chargeback` of `psp` for `amount` cents,
/// dated 2026-12-20: after the chargeback (a [`modification`] is dated 2026-11-30).
fn chargeback_reversed(chargeback: &str, psp: &str, amount: i64) -> serde_json::Value {
    let mut reversed = modification("CHARGEBACK_REVERSED", chargeback, psp, amount);
    reversed["eventDate"] = json!("2026-12-20T12:00:00+01:00");
    reversed
}

/// Paddle's `chargeback_reverse` adjustment of 500 cents of `txn` (event `evt_cbr`), dated
/// 2026-12-15: after the payment and its chargeback. It names no chargeback.
fn paddle_chargeback_reverse(txn: &str) -> serde_json::Value {
    let mut reverse = paddle::chargeback("evt_cbr", "adj_cbr", txn, "partial", 500);
    reverse["data"]["action"] = json!("chargeback_reverse");
    reverse["occurred_at"] = json!("2026-12-15T11:00:00.000000Z");
    reverse
}

#[tokio::test]
async fn an_adyen_chargeback_reversed_makes_the_payment_stand_again() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_A", 3)]).await;
    let ids: Vec<_> = app
        .tokens_of("PSP_A")
        .await
        .iter()
        .map(|t| t.get_object_id("_id").unwrap())
        .collect();
    adyen::send(&app, &[modification("CHARGEBACK", "CB_1", "PSP_A", 1000)]).await;
    assert!(app.active_indexes("PSP_A").await.is_empty());
    assert_eq!(payment_status(&app, "PSP_A").await, "refunded");

    adyen::send(&app, &[chargeback_reversed("CB_1", "PSP_A", 1000)]).await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1, 2]);
    let now: Vec<_> = app
        .tokens_of("PSP_A")
        .await
        .iter()
        .map(|t| t.get_object_id("_id").unwrap())
        .collect();
    assert_eq!(now, ids, "the same tokens");
    assert_eq!(payment_status(&app, "PSP_A").await, "succeeded");
    let receipt = app
        .find_stored(
            "webhook_events",
            doc! { "eventId": "CHARGEBACK_REVERSED:CB_1:true" },
        )
        .await;
    assert_eq!(receipt.get_str("outcome").unwrap(), "reinstated");
    assert_eq!(
        receipt.get_i64("tokensReactivated").unwrap(),
        3,
        "{receipt}"
    );

    // The chargeback's item, signed once, sent again after its dedupe record expired
    // with a later `eventDate` (which the signature does not cover): the chargeback is
    // already counted, and the reversal stands.
    expire(&app, "CHARGEBACK:CB_1:true").await;
    let mut replayed = modification("CHARGEBACK", "CB_1", "PSP_A", 1000);
    replayed["eventDate"] = json!("2027-01-30T12:00:00+01:00");
    adyen::send(&app, &[replayed]).await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "PSP_A").await, "succeeded");
    // And the reversal replayed with other unsigned fields counts once.
    expire(&app, "CHARGEBACK_REVERSED:CB_1:true").await;
    let mut again = modification("CHARGEBACK_REVERSED", "CB_1", "PSP_A", 1000);
    again["eventDate"] = json!("2025-01-01T00:00:00Z");
    again["additionalData"] = json!({ "metadata.tokenmint_quantity": "9" });
    adyen::send(&app, &[again]).await;
    let stored = payment(&app, "PSP_A").await;
    assert_eq!(stored.get_array("reversals").unwrap().len(), 1, "{stored}");
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1, 2]);
    verify_clean(&app).await;
}

#[tokio::test]
async fn an_adyen_reversal_before_its_chargeback_converges() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_B", 2)]).await;
    adyen::send(
        &app,
        &[modification("CHARGEBACK_REVERSED", "CB_2", "PSP_B", 1000)],
    )
    .await;
    adyen::send(&app, &[modification("CHARGEBACK", "CB_2", "PSP_B", 1000)]).await;
    assert_eq!(app.active_indexes("PSP_B").await, vec![0, 1]);
    assert_eq!(payment_status(&app, "PSP_B").await, "succeeded");
    verify_clean(&app).await;
}

#[tokio::test]
async fn adyen_failed_and_reversed_refunds_give_their_amount_back() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_C", 4)]).await;
    adyen::send(
        &app,
        &[
            modification("REFUND", "RF_1", "PSP_C", 500),
            modification("REFUND", "RF_2", "PSP_C", 250),
        ],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_C").await, vec![0]);
    // RF_1 failed at the card scheme: its 500 back, floor(4 × 250 ÷ 1000) = 1 revoked.
    adyen::send(&app, &[modification("REFUND_FAILED", "RF_1", "PSP_C", 500)]).await;
    assert_eq!(app.active_indexes("PSP_C").await, vec![0, 1, 2]);
    // RF_2's money came back to the merchant's account.
    adyen::send(
        &app,
        &[modification("REFUNDED_REVERSED", "RF_2", "PSP_C", 250)],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_C").await, vec![0, 1, 2, 3]);
    // A reversal never gives back more than its refund: RF_3's failure reported for
    // 900 gives back RF_3's 500, and RF_4's 250 stays taken: one token revoked.
    adyen::send(
        &app,
        &[
            modification("REFUND", "RF_3", "PSP_C", 500),
            modification("REFUND", "RF_4", "PSP_C", 250),
        ],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_C").await, vec![0]);
    adyen::send(&app, &[modification("REFUND_FAILED", "RF_3", "PSP_C", 900)]).await;
    assert_eq!(
        statuses(&app, "PSP_C").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_paddle_chargeback_reverse_gives_the_chargeback_back() {
    let app = spawn_app_with(PADDLE).await;
    paddle::send(&app, &paddle::completed("evt_c", "txn_1", 4)).await;
    paddle::send(
        &app,
        &paddle::chargeback("evt_cb", "adj_cb", "txn_1", "partial", 500),
    )
    .await;
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1]);
    let receipt = paddle::send(&app, &paddle_chargeback_reverse("txn_1")).await;
    assert_eq!(receipt["outcome"], "reinstated", "{receipt}");
    assert_eq!(receipt["tokensReactivated"], 2, "{receipt}");
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1, 2, 3]);
    // A chargeback warning moves no money.
    let mut warning = paddle::chargeback("evt_w", "adj_w", "txn_1", "full", 1000);
    warning["data"]["action"] = json!("chargeback_warning");
    assert_eq!(paddle::send(&app, &warning).await["outcome"], "ignored");
    assert_eq!(app.active_indexes("txn_1").await, vec![0, 1, 2, 3]);
    verify_clean(&app).await;
}

/// A chargeback of the whole payment (`full`) for the 300 a refund of 700 left, reversed
/// for 300 by Paddle's reversal (which names no chargeback): the chargeback is undone
/// whole and the refund's share alone stays withdrawn.
#[tokio::test]
async fn a_paddle_full_chargeback_of_what_a_refund_left_reversed_gives_that_back() {
    let app = spawn_app_with(PADDLE).await;
    paddle::send(&app, &paddle::completed("evt_c", "txn_f", 10)).await;
    paddle::send(
        &app,
        &paddle::refund("evt_r", "adj_r", "txn_f", "partial", 700),
    )
    .await;
    assert_eq!(app.active_indexes("txn_f").await, vec![0, 1, 2]);
    paddle::send(
        &app,
        &paddle::chargeback("evt_cb", "adj_cb", "txn_f", "full", 300),
    )
    .await;
    assert!(app.active_indexes("txn_f").await.is_empty());

    let mut reverse = paddle_chargeback_reverse("txn_f");
    reverse["data"]["totals"] = json!({ "subtotal": "300", "tax": "0", "total": "300" });
    let receipt = paddle::send(&app, &reverse).await;
    assert_eq!(receipt["tokensReactivated"], 3, "{receipt}");
    assert_eq!(app.active_indexes("txn_f").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "txn_f").await, "succeeded");
    verify_clean(&app).await;
}

/// Paddle's reversal names no chargeback, so it gives back only what chargebacks took:
/// never a refund's share, and a reversal delivered before its chargeback waits for it.
#[tokio::test]
async fn a_paddle_chargeback_reverse_never_gives_back_a_refund() {
    let app = spawn_app_with(PADDLE).await;
    paddle::send(&app, &paddle::completed("evt_c", "txn_2", 4)).await;
    paddle::send(
        &app,
        &paddle::refund("evt_r", "adj_r", "txn_2", "partial", 500),
    )
    .await;
    assert_eq!(app.active_indexes("txn_2").await, vec![0, 1]);
    // The chargeback's reversal arrives first (or its chargeback was never counted).
    let receipt = paddle::send(&app, &paddle_chargeback_reverse("txn_2")).await;
    assert_ne!(receipt["tokensReactivated"], 2, "{receipt}");
    assert_eq!(
        app.active_indexes("txn_2").await,
        vec![0, 1],
        "the refund stands"
    );
    // Its chargeback, then: taken and given back, the refund's share stays withdrawn.
    paddle::send(
        &app,
        &paddle::chargeback("evt_cb", "adj_cb", "txn_2", "partial", 500),
    )
    .await;
    assert_eq!(app.active_indexes("txn_2").await, vec![0, 1]);
    verify_clean(&app).await;
}

/// An Adyen chargeback of part of the payment takes the whole payment back, and its
/// reversal, for all the chargeback named, undoes it: the tokens all stand again.
#[tokio::test]
async fn an_adyen_partial_chargeback_reversed_in_full_gives_every_token_back() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_P", 10)]).await;
    adyen::send(&app, &[modification("CHARGEBACK", "CB_P", "PSP_P", 400)]).await;
    assert!(app.active_indexes("PSP_P").await.is_empty());
    adyen::send(&app, &[chargeback_reversed("CB_P", "PSP_P", 400)]).await;
    assert_eq!(
        app.active_indexes("PSP_P").await,
        (0..10).collect::<Vec<i64>>()
    );
    verify_clean(&app).await;
}

/// A Standard Webhooks `payment.<kind>` event of `payment` (1000 cents) at `version`,
/// with `data`'s fields added to its `data`.
fn standard_event(
    payment: &str,
    kind: &str,
    version: i64,
    data: serde_json::Value,
) -> serde_json::Value {
    let mut body = json!({ "type": format!("payment.{kind}"), "timestamp": "2026-11-30T00:00:00Z",
        "data": { "paymentIntentId": payment, "version": version, "amount": 1000 } });
    for (field, value) in data.as_object().unwrap() {
        body["data"][field] = value.clone();
    }
    body
}

/// A full refund that named no amount (kept as a full withdrawal of 0) is the whole
/// payment: a reinstatement of part of it gives back that part, not everything.
#[tokio::test]
async fn a_partial_reinstatement_of_a_refund_of_no_amount_gives_back_only_its_part() {
    let app = spawn_app_with(PROVIDERS).await;
    let event = |kind: &str, version: i64, data: serde_json::Value| {
        standard_event("pay_0", kind, version, data)
    };
    let paid = json!({ "owner": OWNER, "tokenType": "standard", "quantity": 4 });
    for (id, body) in [
        ("msg_paid0", event("succeeded", 1, paid)),
        ("msg_ref0", event("refunded", 2, json!({}))),
        (
            "msg_back0",
            event("reinstated", 3, json!({ "amountReinstated": 250 })),
        ),
    ] {
        assert_eq!(send_acme(&app, id, &body).await.status(), 200, "{id}");
    }
    // 1000 − 250 withdrawn of 1000: floor(4 × 750 ÷ 1000) = 3 taken back.
    assert_eq!(
        statuses(&app, "pay_0").await,
        ["active", "revoked", "revoked", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_standard_webhooks_reinstatement_gives_back_what_it_names() {
    let app = spawn_app_with(PROVIDERS).await;
    let event = |kind: &str, version: i64, data: serde_json::Value| {
        standard_event("pay_1", kind, version, data)
    };
    let send = |id: &'static str, body: serde_json::Value| {
        let app = &app;
        async move {
            let answer = send_acme(app, id, &body).await;
            assert_eq!(answer.status(), 200);
            json(answer).await
        }
    };
    send(
        "msg_paid",
        event(
            "succeeded",
            1,
            json!({ "owner": OWNER, "tokenType": "standard", "quantity": 4 }),
        ),
    )
    .await;
    let refunded = send(
        "msg_ref",
        event("refunded", 2, json!({ "amountRefunded": 1000 })),
    )
    .await;
    assert_eq!(refunded["tokensRevoked"], 4, "{refunded}");
    let back = send(
        "msg_back",
        event("reinstated", 3, json!({ "amountReinstated": 750 })),
    )
    .await;
    assert_eq!(back["outcome"], "reinstated", "{back}");
    assert_eq!(back["tokensReactivated"], 3, "{back}");
    assert_eq!(
        statuses(&app, "pay_1").await,
        ["active", "active", "active", "revoked"]
    );
    assert_eq!(payment_status(&app, "pay_1").await, "succeeded");
    // A running total: an older, smaller report changes nothing.
    let older = send(
        "msg_older",
        event("reinstated", 3, json!({ "amountReinstated": 250 })),
    )
    .await;
    assert_eq!(older["tokensReactivated"], 0, "{older}");
    assert_eq!(
        statuses(&app, "pay_1").await,
        ["active", "active", "active", "revoked"]
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_success_replayed_after_its_capture_failed_gives_no_token_back() {
    // Adyen signs neither `eventDate` nor `additionalData`: a captured AUTHORISATION,
    // sent again once its dedupe record expired with a date after the CAPTURE_FAILED,
    // makes the payment succeeded again by its date — but no money came, so the tokens
    // the failure took back stay revoked.
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_F", 4)]).await;
    assert_eq!(app.active_indexes("PSP_F").await, vec![0, 1, 2, 3]);
    let mut failed = modification("CAPTURE_FAILED", "CAP_F", "PSP_F", 1000);
    failed["eventDate"] = json!("2026-11-30T13:00:00+01:00");
    adyen::send(&app, &[failed]).await;
    assert!(app.active_indexes("PSP_F").await.is_empty());

    expire(&app, "AUTHORISATION:PSP_F:true").await;
    let mut replayed = authorisation("PSP_F", 4);
    replayed["eventDate"] = json!("2027-01-30T12:00:00+01:00");
    adyen::send(&app, &[replayed]).await;
    assert!(
        app.active_indexes("PSP_F").await.is_empty(),
        "a token the failure revoked came back"
    );
    let tokens = app.tokens_of("PSP_F").await;
    assert!(
        tokens
            .iter()
            .all(|t| t.get_str("revocationReason") == Ok("failed")),
        "{tokens:?}"
    );
    verify_clean(&app).await;
}

#[tokio::test]
async fn a_second_chargeback_after_a_reversal_takes_the_tokens_back_again() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_S", 3)]).await;
    adyen::send(&app, &[modification("CHARGEBACK", "CB_S", "PSP_S", 1000)]).await;
    adyen::send(&app, &[chargeback_reversed("CB_S", "PSP_S", 1000)]).await;
    assert_eq!(app.active_indexes("PSP_S").await, vec![0, 1, 2]);

    // The issuer disputes again and wins: the money is taken back a second time.
    let mut second = modification("SECOND_CHARGEBACK", "CB_S", "PSP_S", 1000);
    second["eventDate"] = json!("2027-01-20T12:00:00+01:00");
    adyen::send(&app, &[second]).await;
    assert!(app.active_indexes("PSP_S").await.is_empty());
    assert_eq!(payment_status(&app, "PSP_S").await, "refunded");
    verify_clean(&app).await;
}

/// Adyen leaves `originalReference` out of some dispute stages unless the webhook is set
/// to include it: such an item names no payment. It is recorded `ignored`, saying what to
/// set, apart from its id (`#originalReference`), so that it never stands for the item.
#[tokio::test]
async fn a_dispute_stage_that_names_no_payment_says_what_to_set_and_keeps_its_id_free() {
    let app = spawn_app_with(ADYEN).await;
    adyen::send(&app, &[authorisation("PSP_N", 3)]).await;
    let mut second = modification("SECOND_CHARGEBACK", "CB_N", "", 1000);
    second["originalReference"] = serde_json::Value::Null;
    adyen::send(&app, &[second]).await;
    let recorded = app
        .find_stored(
            "webhook_events",
            doc! { "eventId": "SECOND_CHARGEBACK:CB_N:true#originalReference" },
        )
        .await;
    assert_eq!(
        recorded.get_str("outcome").unwrap(),
        "ignored",
        "{recorded}"
    );
    assert!(
        recorded
            .get_str("detail")
            .unwrap()
            .contains("enable the dispute's originalReference"),
        "{recorded}"
    );
    assert_eq!(
        app.count(
            "webhook_events",
            doc! { "eventId": "SECOND_CHARGEBACK:CB_N:true" }
        )
        .await,
        0
    );
    assert_eq!(app.active_indexes("PSP_N").await, vec![0, 1, 2]);
}
