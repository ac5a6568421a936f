//! `providers.<name>.capture`: under manual capture an Adyen `AUTHORISATION` only makes
//! the payment processing (its token parameters kept on the payment) and the `CAPTURE`
//! is the success that issues them; a `CAPTURE_FAILED` fails the payment and takes back
//! whatever was issued, under either setting.

use mongodb::bson::doc;
use serde_json::{Value, json};

use super::{adyen_capture, adyen_manual};
use crate::adyen::{ADYEN, ADYEN_NEW, authorisation, modification, post_batch, send, signed_batch};
use crate::helpers::*;
use crate::provider_events::payment_status;

/// An item `code` against `original`, at `date`.
fn at(code: &str, psp: &str, original: &str, date: &str) -> Value {
    let mut item = modification(code, psp, original, 1000);
    item["eventDate"] = json!(date);
    item
}

async fn outcome(app: &TestApp, event_id: &str) -> String {
    app.find_stored("webhook_events", doc! { "eventId": event_id })
        .await
        .get_str("outcome")
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn under_manual_capture_the_capture_issues_the_authorisations_tokens() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_M", 3)]).await;
    assert_eq!(payment_status(&app, "PSP_M").await.0, "processing");
    assert_eq!(
        app.count("tokens", doc! {}).await,
        0,
        "authorised, not paid"
    );
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_M" })
        .await;
    assert_eq!(
        stored_int(payment.get_document("tokenParams").unwrap(), "quantity"),
        Some(3)
    );

    let capture = at("CAPTURE", "CAP_1", "PSP_M", "2026-11-30T15:00:00Z");
    send(&app, std::slice::from_ref(&capture)).await;
    assert_eq!(outcome(&app, "CAPTURE:CAP_1:true").await, "issued");
    assert_eq!(app.active_indexes("PSP_M").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "PSP_M").await.0, "succeeded");
    // Redelivered, both change nothing.
    send(&app, &[authorisation("PSP_M", 3), capture]).await;
    assert_eq!(app.count_records(doc! {}).await, 1);
    assert_eq!(app.token_indexes("PSP_M").await, vec![0, 1, 2]);
}

/// Adyen captures a payment in parts when asked to: each `CAPTURE` is of its own amount,
/// and the payment is what they add up to, whatever order they arrive in. A refund is
/// then judged against that sum, not against the last capture's amount.
#[tokio::test]
async fn partial_captures_add_up_to_the_payment_a_refund_is_judged_against() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_PC", 10)]).await;
    let part = |psp: &str, value: i64, date: &str| adyen_capture(psp, "PSP_PC", value, date);
    // The later capture is delivered first; the earlier one, then, and again.
    send(&app, &[part("CAP_B", 700, "2026-11-30T16:00:00Z")]).await;
    send(&app, &[part("CAP_A", 300, "2026-11-30T15:00:00Z")]).await;
    send(&app, &[part("CAP_A", 300, "2026-11-30T15:00:00Z")]).await;
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_PC" })
        .await;
    assert_eq!(stored_int(&payment, "amount"), Some(1000), "{payment}");
    assert_eq!(
        app.active_indexes("PSP_PC").await,
        (0..10).collect::<Vec<i64>>()
    );
    // A refund of 700 of the 1000 captured keeps 3 of the 10 tokens.
    let mut refund = modification("REFUND", "REF_PC", "PSP_PC", 700);
    refund["eventDate"] = json!("2026-11-30T17:00:00Z");
    send(&app, &[refund]).await;
    assert_eq!(app.active_indexes("PSP_PC").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "PSP_PC").await.0, "succeeded");
}

/// A part of a capture whose issuance fails after its projection recorded the part (the
/// batch is refused, Adyen delivers it again), then delivered again, and once more after
/// its dedupe record expired: the part counts once, the tokens are issued once, and a
/// refund is still judged against the sum of the parts.
#[tokio::test]
async fn a_capture_part_recorded_before_a_failure_counts_once_when_delivered_again() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", adyen_manual()),
    )
    .await;
    send(&app, &[authorisation("PSP_CF", 10)]).await;
    let part = |psp: &str, value: i64, date: &str| adyen_capture(psp, "PSP_CF", value, date);
    let first = part("CAP_X", 300, "2026-11-30T15:00:00Z");
    // The projection (a findAndModify upsert) passes; the issuance's inserts fail.
    let failing = FailPoint::always(&name, &["insert"], Fault::error(91)).await;
    let refused = post_batch(&app, signed_batch(std::slice::from_ref(&first), ADYEN_NEW)).await;
    failing.off().await;
    assert_ne!(refused.text().await.unwrap(), "[accepted]");
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_CF" })
        .await;
    assert_eq!(
        stored_int(&payment, "amount"),
        Some(300),
        "the part was recorded"
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Adyen delivers it again, then the other part; then the first once more, after its
    // dedupe record expired.
    send(&app, std::slice::from_ref(&first)).await;
    send(&app, &[part("CAP_Y", 700, "2026-11-30T16:00:00Z")]).await;
    app.db
        .collection::<mongodb::bson::Document>("webhook_events")
        .delete_one(doc! { "eventId": "CAPTURE:CAP_X:true" })
        .await
        .unwrap();
    send(&app, &[first]).await;
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_CF" })
        .await;
    assert_eq!(stored_int(&payment, "amount"), Some(1000), "{payment}");
    assert_eq!(payment.get_array("captures").unwrap().len(), 2);
    assert_eq!(app.count_records(doc! {}).await, 1);
    assert_eq!(
        app.active_indexes("PSP_CF").await,
        (0..10).collect::<Vec<i64>>()
    );
    let mut refund = modification("REFUND", "REF_CF", "PSP_CF", 700);
    refund["eventDate"] = json!("2026-11-30T17:00:00Z");
    send(&app, &[refund]).await;
    assert_eq!(app.active_indexes("PSP_CF").await, vec![0, 1, 2]);
}

#[tokio::test]
async fn a_capture_before_its_authorisation_issues_once_the_parameters_arrive() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(
        &app,
        &[at("CAPTURE", "CAP_1", "PSP_O", "2026-11-30T15:00:00Z")],
    )
    .await;
    assert_eq!(outcome(&app, "CAPTURE:CAP_1:true").await, "no_metadata");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    send(&app, &[authorisation("PSP_O", 2)]).await;
    assert_eq!(outcome(&app, "AUTHORISATION:PSP_O:true").await, "issued");
    assert_eq!(app.active_indexes("PSP_O").await, vec![0, 1]);
    assert_eq!(
        payment_status(&app, "PSP_O").await.0,
        "succeeded",
        "never back to processing"
    );
}

#[tokio::test]
async fn a_failed_capture_takes_the_tokens_back() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_F", 3)]).await;
    send(
        &app,
        &[at("CAPTURE", "CAP_1", "PSP_F", "2026-11-30T15:00:00Z")],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_F").await, vec![0, 1, 2]);
    // Days later the card scheme rejects the capture.
    send(
        &app,
        &[at(
            "CAPTURE_FAILED",
            "CAP_1",
            "PSP_F",
            "2026-12-02T08:00:00Z",
        )],
    )
    .await;
    assert_eq!(outcome(&app, "CAPTURE_FAILED:CAP_1:true").await, "revoked");
    assert!(app.active_indexes("PSP_F").await.is_empty());
    for token in app.tokens_of("PSP_F").await {
        assert_eq!(token.get_str("revocationReason").unwrap(), "failed");
    }
    assert_eq!(payment_status(&app, "PSP_F").await.0, "failed");
    // A capture redelivered (its older date) does not make it paid again.
    app.db
        .collection::<mongodb::bson::Document>("webhook_events")
        .delete_one(doc! { "eventId": "CAPTURE:CAP_1:true" })
        .await
        .unwrap();
    send(
        &app,
        &[at("CAPTURE", "CAP_1", "PSP_F", "2026-11-30T15:00:00Z")],
    )
    .await;
    assert!(app.active_indexes("PSP_F").await.is_empty());
    assert_eq!(payment_status(&app, "PSP_F").await.0, "failed");
    let mut body = issuance_body("PSP_F", 3);
    body["provider"] = json!("adyen");
    body["accountId"] = json!("TestMerchant");
    assert_problem(
        app.issue(ADMIN_KEY, &body).await,
        409,
        "payment_not_succeeded",
    )
    .await;

    // `verify` holds a failed payment to none: clean now, and a token made active behind
    // the service's back is reported.
    let store = app.store().await;
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    app.db
        .collection::<mongodb::bson::Document>("tokens")
        .update_one(
            doc! { "origin.paymentIntentId": "PSP_F", "tokenIndex": 0 },
            doc! { "$set": { "status": "active" } },
        )
        .await
        .unwrap();
    let report = store.verify().await.unwrap();
    let samples = report.unbacked_active_tokens.samples.join("\n");
    assert!(
        samples.contains("adyen/TestMerchant/PSP_F (failed): 1 active token(s)"),
        "{report}"
    );
}

#[tokio::test]
async fn an_authorisation_canceled_before_its_capture_issues_nothing() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_C", 2)]).await;
    send(
        &app,
        &[at("CANCELLATION", "CAN_1", "PSP_C", "2026-11-30T12:00:00Z")],
    )
    .await;
    assert_eq!(payment_status(&app, "PSP_C").await.0, "canceled");
    send(
        &app,
        &[at("CAPTURE", "CAP_1", "PSP_C", "2026-11-30T15:00:00Z")],
    )
    .await;
    // A cancellation outranks every success: the later-dated capture is older.
    assert_eq!(outcome(&app, "CAPTURE:CAP_1:true").await, "stale");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}

#[tokio::test]
async fn under_automatic_capture_a_capture_is_no_news_and_a_failed_one_revokes() {
    let app = spawn_app_with(ADYEN).await;
    send(&app, &[authorisation("PSP_A", 2)]).await;
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1]);
    send(
        &app,
        &[at("CAPTURE", "CAP_1", "PSP_A", "2026-11-30T15:00:00Z")],
    )
    .await;
    assert_eq!(outcome(&app, "CAPTURE:CAP_1:true").await, "ignored");
    assert_eq!(app.active_indexes("PSP_A").await, vec![0, 1]);
    send(
        &app,
        &[at(
            "CAPTURE_FAILED",
            "CAP_1",
            "PSP_A",
            "2026-12-02T08:00:00Z",
        )],
    )
    .await;
    assert!(app.active_indexes("PSP_A").await.is_empty());
    assert_eq!(payment_status(&app, "PSP_A").await.0, "failed");
}

#[test]
fn capture_is_an_adyen_setting_and_only_auto_or_manual() {
    let refused = |config: &str| {
        tokenmint::settings::Settings::with_overrides(&[config])
            .unwrap_err()
            .to_string()
    };
    let stripe = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_test_new_secret_0123456789\"]\ncapture = \"manual\"\n";
    let err = refused(stripe);
    assert!(err.contains("providers.stripe.capture"), "{err}");
    let err = refused(&format!("{ADYEN}capture = \"later\"\n"));
    assert!(err.contains("capture"), "{err}");
}

/// A capture the scheme rejected is money that never came in, recorded as such whatever
/// the payment's status (a refunded payment's held back, `terminal`): the refund's
/// failure that follows gives back the refund, not the capture, and no token stands
/// again for a payment nobody paid. The same whichever of the two is dated first or
/// delivered first, and when both carry the same second.
#[tokio::test]
async fn a_capture_failed_after_a_refund_keeps_the_refunds_failure_from_reviving_the_tokens() {
    let app = spawn_app_with(ADYEN).await;
    const EARLIER: &str = "2026-11-30T12:00:00Z";
    const LATER: &str = "2026-12-01T08:00:00Z";
    for (payment, first, second) in [
        // The refund first, the capture's failure after it: dated so, or delivered so.
        ("PSP_G", ("REFUND", EARLIER), ("CAPTURE_FAILED", LATER)),
        ("PSP_H", ("CAPTURE_FAILED", LATER), ("REFUND", EARLIER)),
        // The capture's failure first.
        ("PSP_K", ("CAPTURE_FAILED", EARLIER), ("REFUND", LATER)),
        ("PSP_L", ("REFUND", LATER), ("CAPTURE_FAILED", EARLIER)),
        // The same second.
        ("PSP_I", ("REFUND", EARLIER), ("CAPTURE_FAILED", EARLIER)),
        ("PSP_J", ("CAPTURE_FAILED", EARLIER), ("REFUND", EARLIER)),
    ] {
        send(&app, &[authorisation(payment, 10)]).await;
        assert_eq!(app.active_indexes(payment).await.len(), 10);
        let item = |(code, date): (&str, &str)| {
            let psp = if code == "REFUND" { "REF_" } else { "CAP_" };
            at(code, &format!("{psp}{payment}"), payment, date)
        };
        send(&app, &[item(first)]).await;
        send(&app, &[item(second)]).await;
        assert!(app.active_indexes(payment).await.is_empty(), "{payment}");
        send(
            &app,
            &[at(
                "REFUND_FAILED",
                &format!("REF_{payment}"),
                payment,
                "2026-12-02T08:00:00Z",
            )],
        )
        .await;
        assert!(app.active_indexes(payment).await.is_empty(), "{payment}");
        assert_ne!(
            payment_status(&app, payment).await.0,
            "succeeded",
            "{payment}"
        );
    }
    assert_eq!(
        outcome(&app, "CAPTURE_FAILED:CAP_PSP_G:true").await,
        "terminal"
    );
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// The failed capture's money is written first, then the payment's projection: when the
/// projection fails after the money was written, the item is answered with an error,
/// Adyen delivers it again, and the redelivery counts the money once. The refund's
/// failure after it still revives nothing.
#[tokio::test]
async fn a_failed_capture_whose_projection_fails_after_its_money_is_written_converges() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, ADYEN).await;
    send(&app, &[authorisation("PSP_W", 10)]).await;
    send(
        &app,
        &[at("REFUND", "REF_W", "PSP_W", "2026-11-30T12:00:00Z")],
    )
    .await;
    let failed = at("CAPTURE_FAILED", "CAP_W", "PSP_W", "2026-12-01T08:00:00Z");
    let payments = format!("{}.payments", app.db_name);
    // The money's record is the item's first findAndModify on `payments`, the
    // projection its second.
    let failpoint =
        FailPoint::after_first_on(&name, &["findAndModify"], &payments, Fault::error(2)).await;
    let answer = post_batch(&app, signed_batch(std::slice::from_ref(&failed), ADYEN_NEW)).await;
    assert!(failpoint.off().await >= 1, "the projection failed");
    assert_ne!(
        answer.status(),
        200,
        "unanswered, so Adyen delivers it again"
    );
    let refunds = |payment: mongodb::bson::Document| {
        payment
            .get_array("refunds")
            .unwrap()
            .iter()
            .map(|refund| {
                refund
                    .as_document()
                    .unwrap()
                    .get_str("id")
                    .unwrap()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    let stored = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_W" })
        .await;
    assert_eq!(refunds(stored), ["refund:REF_W", "capture_failed:CAP_W"]);

    send(&app, &[failed]).await;
    send(
        &app,
        &[at(
            "REFUND_FAILED",
            "REF_W",
            "PSP_W",
            "2026-12-02T08:00:00Z",
        )],
    )
    .await;
    let stored = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_W" })
        .await;
    assert_eq!(
        stored_int(&stored, "amountRefunded"),
        Some(2000),
        "counted once"
    );
    assert!(app.active_indexes("PSP_W").await.is_empty());
    assert!(app.store().await.verify().await.unwrap().is_clean());
}
