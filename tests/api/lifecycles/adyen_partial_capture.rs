//! An Adyen payment under manual capture captured for less than was authorised: the
//! payment stands only for what was captured, the rest of its tokens written revoked, and
//! a later capture (Adyen's multiple partial captures) brings back the share it pays for.
//! Each test authorises 1,000 cents for 10 tokens (`authorisation`).

use mongodb::bson::doc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{adyen_capture, adyen_manual, recorded};
use crate::adyen::{ADYEN_NEW, authorisation, modification, post_batch, send, signed_batch};
use crate::helpers::*;
use crate::provider_events::payment_status;

/// The payment's tokens that are revoked, each with its reason.
async fn revoked(app: &TestApp, payment: &str) -> Vec<(i64, String)> {
    app.tokens_of(payment)
        .await
        .into_iter()
        .filter(|token| token.get_str("status") == Ok("revoked"))
        .map(|token| {
            (
                stored_int(&token, "tokenIndex").unwrap(),
                token.get_str("revocationReason").unwrap().to_owned(),
            )
        })
        .collect()
}

/// What `verify` reports once token `index` of `payment`, clean before, is set to
/// `status` behind the service's back (as the provider's settle would have left it).
async fn report_after_setting(
    app: &TestApp,
    payment: &str,
    index: i64,
    status: &str,
) -> tokenmint::store::VerifyReport {
    let store = app.store().await;
    assert!(store.verify().await.unwrap().is_clean());
    app.db
        .collection::<mongodb::bson::Document>("tokens")
        .update_one(
            doc! { "origin.paymentIntentId": payment, "tokenIndex": index },
            doc! { "$set": { "status": status, "lastChangedBy": "provider:adyen" } },
        )
        .await
        .unwrap();
    store.verify().await.unwrap()
}

/// `item` dated `date` (its `eventDate`).
fn dated(mut item: Value, date: &str) -> Value {
    item["eventDate"] = json!(date);
    item
}

fn partly_refunded(indexes: std::ops::Range<i64>) -> Vec<(i64, String)> {
    indexes.map(|i| (i, "partial_refund".to_owned())).collect()
}

#[tokio::test]
async fn a_payment_captured_in_part_keeps_only_the_tokens_its_capture_paid_for() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_P", 10)]).await;
    send(
        &app,
        &[adyen_capture("CAP_P", "PSP_P", 600, "2026-11-30T15:00:00Z")],
    )
    .await;
    let recorded = app
        .find_stored("webhook_events", doc! { "eventId": "CAPTURE:CAP_P:true" })
        .await;
    assert_eq!(recorded.get_str("outcome").unwrap(), "issued", "{recorded}");
    assert_eq!(
        app.active_indexes("PSP_P").await,
        (0..6).collect::<Vec<i64>>()
    );
    assert_eq!(revoked(&app, "PSP_P").await, partly_refunded(6..10));
    // Written revoked: never active, not even for the moment before a settle.
    for token in app.tokens_of("PSP_P").await {
        assert_eq!(stored_int(&token, "_version"), Some(0), "{token}");
    }
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_P" })
        .await;
    assert_eq!(stored_int(&payment, "amount"), Some(600), "{payment}");
    assert_eq!(stored_int(&payment, "authorisedAmount"), Some(1000));
    assert_eq!(payment_status(&app, "PSP_P").await.0, "succeeded");
    assert!(app.store().await.verify().await.unwrap().is_clean());

    // A refund of 300 of the 600 captured: 3 tokens stand for the 300 kept.
    let mut refund = modification("REFUND", "REF_P", "PSP_P", 300);
    refund["eventDate"] = json!("2026-11-30T17:00:00Z");
    send(&app, &[refund]).await;
    assert_eq!(app.active_indexes("PSP_P").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "PSP_P").await.0, "succeeded");
    // The rest of what was captured: nothing stands, the payment is refunded.
    let mut rest = modification("REFUND", "REF_P2", "PSP_P", 300);
    rest["eventDate"] = json!("2026-11-30T18:00:00Z");
    send(&app, &[rest]).await;
    assert!(app.active_indexes("PSP_P").await.is_empty());
    assert_eq!(payment_status(&app, "PSP_P").await.0, "refunded");
}

/// Adyen's multiple partial captures: the remainder of the authorisation may be captured
/// later, and what it pays for stands again. Delivered again, a capture counts once.
#[tokio::test]
async fn a_later_capture_brings_back_the_tokens_it_pays_for() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_L", 10)]).await;
    let first = adyen_capture("CAP_L1", "PSP_L", 300, "2026-11-30T15:00:00Z");
    send(&app, std::slice::from_ref(&first)).await;
    assert_eq!(app.active_indexes("PSP_L").await, vec![0, 1, 2]);
    send(
        &app,
        &[adyen_capture(
            "CAP_L2",
            "PSP_L",
            500,
            "2026-11-30T16:00:00Z",
        )],
    )
    .await;
    assert_eq!(
        app.active_indexes("PSP_L").await,
        (0..8).collect::<Vec<i64>>()
    );
    assert_eq!(revoked(&app, "PSP_L").await, partly_refunded(8..10));
    // The first capture again, after its dedupe record expired: counted once.
    app.db
        .collection::<mongodb::bson::Document>("webhook_events")
        .delete_one(doc! { "eventId": "CAPTURE:CAP_L1:true" })
        .await
        .unwrap();
    send(&app, &[first]).await;
    assert_eq!(
        app.active_indexes("PSP_L").await,
        (0..8).collect::<Vec<i64>>()
    );
    send(
        &app,
        &[adyen_capture(
            "CAP_L3",
            "PSP_L",
            200,
            "2026-11-30T17:00:00Z",
        )],
    )
    .await;
    assert_eq!(
        app.active_indexes("PSP_L").await,
        (0..10).collect::<Vec<i64>>()
    );
    assert_eq!(app.count_records(doc! {}).await, 1);
    // `verify` checks a payment captured in parts: a token left revoked although the
    // captures paid for it is reported.
    let report = report_after_setting(&app, "PSP_L", 9, "revoked").await;
    let samples = report.unrestored_tokens.samples.join("\n");
    assert!(
        samples.contains("adyen/TestMerchant/PSP_L (succeeded): 1 token(s) revoked"),
        "{report}"
    );
    // ... and `verify --repair` (as self-repair's sweep) brings it back.
    let repaired = run_command(&mongo_uri(), &app.db_name, &["verify", "--repair"], &[]).await;
    let printed = String::from_utf8_lossy(&repaired.stdout);
    assert_eq!(repaired.status.code(), Some(0), "{printed}");
    assert_eq!(
        app.active_indexes("PSP_L").await,
        (0..10).collect::<Vec<i64>>()
    );
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// A withdrawal of the whole payment after a capture in part took back what was
/// captured, not the authorised amount: money that comes back brings back its share, and
/// a chargeback reversed for all it named itself is undone whole.
#[tokio::test]
async fn a_whole_withdrawal_after_a_capture_in_part_takes_back_only_what_was_captured() {
    let app = spawn_app_with(&adyen_manual()).await;
    for (payment, withdrawal, withdrawn, reversal, given_back, kept) in [
        // Refunded whole, then the refund failed: the 600 captured stand again.
        ("PSP_R", "CANCEL_OR_REFUND", 600, "REFUND_FAILED", 600, 6),
        // Charged back whole, then half of it reversed: 300 of the 600 stand.
        ("PSP_C", "CHARGEBACK", 600, "CHARGEBACK_REVERSED", 300, 3),
        // A chargeback of 400 takes the whole payment (Adyen's are read so); reversed
        // for its 400, it is undone whole: the 600 captured stand again.
        ("PSP_B", "CHARGEBACK", 400, "CHARGEBACK_REVERSED", 400, 6),
    ] {
        send(&app, &[authorisation(payment, 10)]).await;
        send(
            &app,
            &[adyen_capture(
                &format!("CAP_{payment}"),
                payment,
                600,
                "2026-11-30T15:00:00Z",
            )],
        )
        .await;
        let psp = format!("W_{payment}");
        send(
            &app,
            &[dated(
                modification(withdrawal, &psp, payment, withdrawn),
                "2026-11-30T17:00:00Z",
            )],
        )
        .await;
        assert!(app.active_indexes(payment).await.is_empty(), "{payment}");
        assert_eq!(payment_status(&app, payment).await.0, "refunded");
        send(
            &app,
            &[dated(
                modification(reversal, &psp, payment, given_back),
                "2026-11-30T18:00:00Z",
            )],
        )
        .await;
        assert_eq!(
            app.active_indexes(payment).await,
            (0..kept).collect::<Vec<i64>>(),
            "{payment}"
        );
        assert_eq!(payment_status(&app, payment).await.0, "succeeded");
    }
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

#[tokio::test]
async fn a_capture_in_part_before_its_authorisation_issues_only_its_share() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(
        &app,
        &[adyen_capture("CAP_E", "PSP_E", 500, "2026-11-30T15:00:00Z")],
    )
    .await;
    assert_eq!(app.count("tokens", doc! {}).await, 0, "no metadata yet");
    send(&app, &[authorisation("PSP_E", 10)]).await;
    assert_eq!(
        app.active_indexes("PSP_E").await,
        (0..5).collect::<Vec<i64>>()
    );
    assert_eq!(revoked(&app, "PSP_E").await, partly_refunded(5..10));
    assert_eq!(payment_status(&app, "PSP_E").await.0, "succeeded");
    // `verify` holds it to what was captured: a token of the rest made active behind the
    // service's back is reported.
    let report = report_after_setting(&app, "PSP_E", 9, "active").await;
    let samples = report.unbacked_active_tokens.samples.join("\n");
    assert!(
        samples.contains("adyen/TestMerchant/PSP_E (succeeded): 1 active token(s) beyond the 5"),
        "{report}"
    );
}

/// Adyen may capture more than was authorised (overcapture): nothing is left uncaptured,
/// and refunds take shares of what was captured, whichever of the authorisation and the
/// capture arrives first (the authorisation's amount never outranks the captures').
#[tokio::test]
async fn a_capture_of_more_than_was_authorised_keeps_every_token() {
    for authorised_first in [true, false] {
        let app = spawn_app_with(&adyen_manual()).await;
        let capture = adyen_capture("CAP_O", "PSP_O", 1200, "2026-11-30T15:00:00Z");
        let (first, second) = if authorised_first {
            (authorisation("PSP_O", 10), capture)
        } else {
            (capture, authorisation("PSP_O", 10))
        };
        send(&app, &[first]).await;
        send(&app, &[second]).await;
        let all: Vec<i64> = (0..10).collect();
        assert_eq!(app.active_indexes("PSP_O").await, all, "{authorised_first}");
        let stored = app
            .find_stored("payments", doc! { "paymentIntentId": "PSP_O" })
            .await;
        assert_eq!(
            stored.get_i64("amount").ok(),
            Some(1200),
            "{authorised_first}: {stored}"
        );
        // A refund of 600 of the 1,200 paid takes half.
        let mut refund = modification("REFUND", "REF_O", "PSP_O", 600);
        refund["eventDate"] = json!("2026-11-30T17:00:00Z");
        send(&app, &[refund]).await;
        let half: Vec<i64> = (0..5).collect();
        assert_eq!(
            app.active_indexes("PSP_O").await,
            half,
            "{authorised_first}"
        );
    }
}

/// The capture's tokens fail to be written after its projection recorded the part (the
/// batch is refused): Adyen's redelivery writes the uncaptured share revoked all the same.
#[tokio::test]
async fn a_capture_in_part_whose_tokens_failed_to_be_written_issues_its_share_when_sent_again() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", adyen_manual()),
    )
    .await;
    send(&app, &[authorisation("PSP_W", 10)]).await;
    let part = adyen_capture("CAP_W", "PSP_W", 400, "2026-11-30T15:00:00Z");
    let failing = FailPoint::always(&name, &["insert"], Fault::error(91)).await;
    let refused = post_batch(&app, signed_batch(std::slice::from_ref(&part), ADYEN_NEW)).await;
    failing.off().await;
    assert_ne!(refused.text().await.unwrap(), "[accepted]");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    send(&app, &[part]).await;
    assert_eq!(app.active_indexes("PSP_W").await, vec![0, 1, 2, 3]);
    assert_eq!(revoked(&app, "PSP_W").await, partly_refunded(4..10));
    assert_eq!(app.count_records(doc! {}).await, 1);
}

/// The capture that completes the payment arrives while the first capture's issuance
/// still settles by its own read, taken before it: the second capture completes the set
/// (bringing its share back) and marks the record, so the batch's mark finds the record
/// changed and settles again by the payment as it is now. No token the money paid for is
/// left revoked.
#[tokio::test]
async fn a_capture_completing_the_payment_while_the_first_ones_tokens_settle_leaves_them_all_active()
 {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", adyen_manual()),
    )
    .await;
    send(&app, &[authorisation("PSP_X", 10)]).await;
    let tokens = format!("{}.tokens", app.db_name);
    // The first capture's settle, an update of its tokens, held up on the server.
    let held = FailPoint::set_on(
        &name,
        &["update"],
        &tokens,
        Fault::Block { millis: 5000 },
        1,
    )
    .await;
    let first_answered = std::sync::atomic::AtomicBool::new(false);
    let rest = async {
        assert!(held.fired_within(1, Duration::from_secs(10)).await);
        send(
            &app,
            &[adyen_capture(
                "CAP_X2",
                "PSP_X",
                400,
                "2026-11-30T16:00:00Z",
            )],
        )
        .await;
        // The race this is about: the second capture's settle ran while the first's
        // revoke was still held up.
        assert!(!first_answered.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(
            app.active_indexes("PSP_X").await,
            (0..10).collect::<Vec<i64>>()
        );
    };
    let first = [adyen_capture(
        "CAP_X1",
        "PSP_X",
        600,
        "2026-11-30T15:00:00Z",
    )];
    let first_capture = async {
        send(&app, &first).await;
        first_answered.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    tokio::join!(first_capture, rest);
    assert_eq!(held.off().await, 1);
    assert_eq!(
        app.active_indexes("PSP_X").await,
        (0..10).collect::<Vec<i64>>()
    );
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": "PSP_X" })
        .await;
    assert_eq!(record.get_str("status").unwrap(), "issued", "{record}");
}

/// A capture part delivered after a later one (an older `eventDate`) is older than the
/// payment's state, but brings money all the same: its receipt says what it did, not
/// `stale`.
#[tokio::test]
async fn an_older_capture_part_delivered_late_reports_the_tokens_it_brought_back() {
    let app = spawn_app_with(&adyen_manual()).await;
    send(&app, &[authorisation("PSP_Z", 10)]).await;
    send(
        &app,
        &[adyen_capture(
            "CAP_Z2",
            "PSP_Z",
            700,
            "2026-11-30T16:00:00Z",
        )],
    )
    .await;
    assert_eq!(
        app.active_indexes("PSP_Z").await,
        (0..7).collect::<Vec<i64>>()
    );
    send(
        &app,
        &[adyen_capture(
            "CAP_Z1",
            "PSP_Z",
            300,
            "2026-11-30T15:00:00Z",
        )],
    )
    .await;
    assert_eq!(
        app.active_indexes("PSP_Z").await,
        (0..10).collect::<Vec<i64>>()
    );
    let recorded = app
        .find_stored("webhook_events", doc! { "eventId": "CAPTURE:CAP_Z1:true" })
        .await;
    assert_eq!(
        recorded.get_str("outcome").unwrap(),
        "already_issued",
        "{recorded}"
    );
    assert_eq!(
        stored_int(&recorded, "tokensReactivated"),
        Some(3),
        "{recorded}"
    );
}

/// A later capture whose settle cannot write the tokens after its projection recorded
/// the part: the batch is refused, nothing it pays for is active yet, and Adyen's
/// redelivery brings them back, the part counted once.
#[tokio::test]
async fn a_later_capture_whose_tokens_cannot_be_brought_back_does_so_when_sent_again() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", adyen_manual()),
    )
    .await;
    send(&app, &[authorisation("PSP_B", 10)]).await;
    send(
        &app,
        &[adyen_capture(
            "CAP_B1",
            "PSP_B",
            300,
            "2026-11-30T15:00:00Z",
        )],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_B").await, vec![0, 1, 2]);
    let later = adyen_capture("CAP_B2", "PSP_B", 700, "2026-11-30T16:00:00Z");
    let tokens = format!("{}.tokens", app.db_name);
    let failing = FailPoint::always_on(&name, &["update"], &tokens, Fault::error(91)).await;
    let refused = post_batch(&app, signed_batch(std::slice::from_ref(&later), ADYEN_NEW)).await;
    assert!(failing.off().await > 0, "no token update was attempted");
    assert_ne!(refused.text().await.unwrap(), "[accepted]");
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_B" })
        .await;
    assert_eq!(
        stored_int(&payment, "amount"),
        Some(1000),
        "the part was recorded"
    );
    assert_eq!(app.active_indexes("PSP_B").await, vec![0, 1, 2]);

    send(&app, &[later]).await;
    assert_eq!(
        app.active_indexes("PSP_B").await,
        (0..10).collect::<Vec<i64>>()
    );
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_B" })
        .await;
    assert_eq!(payment.get_array("captures").unwrap().len(), 2);
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// Payment `psp` authorised for 10 tokens (1,000) and captured for 600 at 15:00: tokens
/// 0..5 stand, 6..9 are written revoked.
async fn captured_six_of_ten(app: &TestApp, psp: &str) {
    send(app, &[authorisation(psp, 10)]).await;
    let capture = adyen_capture(&format!("CAP_{psp}"), psp, 600, "2026-11-30T15:00:00Z");
    send(app, &[capture]).await;
}

/// The merchant's CANCELLATION, at 16:00, of what `psp`'s capture left reserved; its event
/// id is `CANCELLATION:CAN_{psp}:true`.
fn cancellation_of_the_rest(psp: &str) -> Value {
    let mut cancel = modification("CANCELLATION", &format!("CAN_{psp}"), psp, 1000);
    cancel["eventDate"] = json!("2026-11-30T16:00:00Z");
    cancel
}

/// What a cancellation of the rest of `psp` leaves: itself recorded `ignored`, the 6
/// tokens the capture paid for active, the payment `succeeded`, `verify` clean.
async fn assert_the_captured_share_stands(app: &TestApp, psp: &str) {
    let (outcome, _) = recorded(app, &format!("CANCELLATION:CAN_{psp}:true")).await;
    assert_eq!(outcome, "ignored");
    assert_eq!(app.active_indexes(psp).await, (0..6).collect::<Vec<i64>>());
    assert_eq!(revoked(app, psp).await, partly_refunded(6..10));
    assert_eq!(payment_status(app, psp).await.0, "succeeded");
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// Adyen's multiple partial captures leave the rest of the authorisation reserved until
/// the merchant cancels it: that CANCELLATION, after a capture of 600, releases the 400
/// the money already counts as withdrawn. The 6 tokens the capture paid for stand, the
/// payment stays `succeeded` (its document as the capture left it), and the cancellation
/// is recorded `ignored`.
#[tokio::test]
async fn a_cancellation_of_the_rest_after_a_capture_in_part_keeps_what_was_captured() {
    let app = spawn_app_with(&adyen_manual()).await;
    captured_six_of_ten(&app, "PSP_K").await;
    let payment = doc! { "paymentIntentId": "PSP_K" };
    let before = app.find_stored("payments", payment.clone()).await;

    send(&app, &[cancellation_of_the_rest("PSP_K")]).await;

    assert_the_captured_share_stands(&app, "PSP_K").await;
    assert_eq!(app.find_stored("payments", payment).await, before);

    // A payment with no capture yet is canceled as before.
    send(&app, &[authorisation("PSP_N", 2)]).await;
    send(&app, &[cancellation_of_the_rest("PSP_N")]).await;
    assert_eq!(payment_status(&app, "PSP_N").await.0, "canceled");
    let tokens = doc! { "origin.paymentIntentId": "PSP_N" };
    assert_eq!(app.count("tokens", tokens).await, 0);
}

/// The cancellation of the rest, held back by the capture recorded, fails to record its
/// webhook event (a failover, say): it is answered as failed and Adyen delivers it again.
/// Neither delivery revokes anything; the redelivery is recorded `ignored`.
#[tokio::test]
async fn a_cancellation_of_the_rest_whose_record_fails_keeps_the_captured_share_when_sent_again() {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("{}[repair]\nenabled = false\n", adyen_manual()),
    )
    .await;
    captured_six_of_ten(&app, "PSP_E").await;
    let cancel = cancellation_of_the_rest("PSP_E");
    let events = format!("{}.webhook_events", app.db_name);
    let failing = FailPoint::always_on(&name, &["update"], &events, Fault::error(91)).await;
    let refused = post_batch(&app, signed_batch(std::slice::from_ref(&cancel), ADYEN_NEW)).await;
    assert!(failing.off().await > 0, "the record's write never failed");
    assert_ne!(refused.text().await.unwrap(), "[accepted]");
    assert_eq!(
        app.active_indexes("PSP_E").await,
        (0..6).collect::<Vec<i64>>()
    );
    let recorded = doc! { "eventId": "CANCELLATION:CAN_PSP_E:true" };
    assert_eq!(app.count("webhook_events", recorded).await, 0);

    send(&app, &[cancel]).await;
    assert_the_captured_share_stands(&app, "PSP_E").await;
}

/// A failed capture of one part is that part's money never taken, not the payment's
/// amount: the payment stays measured against what was authorised, and once a refund
/// and its failure have moved it on, the parts that did arrive stand, whichever order
/// the failed part's CAPTURE and CAPTURE_FAILED were delivered in.
#[tokio::test]
async fn a_failed_part_is_its_own_money_whichever_order_its_capture_arrives_in() {
    let app = spawn_app_with(&adyen_manual()).await;
    for (payment, failure_first) in [("PSP_O1", false), ("PSP_O2", true)] {
        send(&app, &[authorisation(payment, 10)]).await;
        let part = |psp: &str, value: i64| {
            adyen_capture(
                &format!("{psp}_{payment}"),
                payment,
                value,
                "2026-11-30T15:00:00Z",
            )
        };
        send(&app, &[part("CAP_A", 600)]).await;
        let failed = dated(
            modification("CAPTURE_FAILED", &format!("CAP_B_{payment}"), payment, 400),
            "2026-12-01T08:00:00Z",
        );
        if failure_first {
            send(&app, std::slice::from_ref(&failed)).await;
            send(&app, &[part("CAP_B", 400)]).await;
        } else {
            send(&app, &[part("CAP_B", 400)]).await;
            send(&app, std::slice::from_ref(&failed)).await;
        }
        let stored = app
            .find_stored("payments", doc! { "paymentIntentId": payment })
            .await;
        assert_eq!(stored_int(&stored, "amount"), Some(1000), "{stored}");
        assert!(app.active_indexes(payment).await.is_empty(), "{payment}");
        let refund = |code: &str, date: &str| {
            dated(
                modification(code, &format!("REF_{payment}"), payment, 600),
                date,
            )
        };
        send(&app, &[refund("REFUND", "2026-12-02T08:00:00Z")]).await;
        send(&app, &[refund("REFUND_FAILED", "2026-12-03T08:00:00Z")]).await;
        assert_eq!(
            app.active_indexes(payment).await,
            (0..6).collect::<Vec<i64>>(),
            "{payment}"
        );
        assert_eq!(payment_status(&app, payment).await.0, "succeeded");
    }
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// Guards of what a refund's failure restores: a cancellation of the rest held back after
/// the refund, or the failed capture of one part (its money recorded), leaves the parts
/// that were captured standing once the refund fails. A report held back from a refunded
/// payment leaves no status behind; one that did would make both `canceled` or `failed`.
#[tokio::test]
async fn a_refunds_failure_restores_the_captured_parts_whatever_adyen_reported_after_the_refund() {
    let app = spawn_app_with(&adyen_manual()).await;
    // A cancellation of the rest, dated after the refund of what was captured.
    captured_six_of_ten(&app, "PSP_RC").await;
    let refund = modification("CANCEL_OR_REFUND", "W_RC", "PSP_RC", 600);
    send(&app, &[dated(refund, "2026-11-30T15:30:00Z")]).await;
    send(&app, &[cancellation_of_the_rest("PSP_RC")]).await;
    let failed = modification("REFUND_FAILED", "W_RC", "PSP_RC", 600);
    send(&app, &[dated(failed, "2026-11-30T18:00:00Z")]).await;
    assert_eq!(payment_status(&app, "PSP_RC").await.0, "succeeded");
    assert_eq!(
        app.active_indexes("PSP_RC").await,
        (0..6).collect::<Vec<i64>>()
    );

    // The failed capture of one part, dated after a refund of both.
    send(&app, &[authorisation("PSP_RF", 10)]).await;
    for (capture, value) in [("CAP_A_RF", 600), ("CAP_B_RF", 400)] {
        send(
            &app,
            &[adyen_capture(
                capture,
                "PSP_RF",
                value,
                "2026-11-30T15:00:00Z",
            )],
        )
        .await;
    }
    let refund = modification("CANCEL_OR_REFUND", "W_RF", "PSP_RF", 1000);
    send(&app, &[dated(refund, "2026-11-30T20:00:00Z")]).await;
    let part_failed = modification("CAPTURE_FAILED", "CAP_B_RF", "PSP_RF", 400);
    send(&app, &[dated(part_failed, "2026-12-01T08:00:00Z")]).await;
    let failed = modification("REFUND_FAILED", "W_RF", "PSP_RF", 1000);
    send(&app, &[dated(failed, "2026-12-03T08:00:00Z")]).await;
    assert_eq!(
        app.active_indexes("PSP_RF").await,
        (0..6).collect::<Vec<i64>>()
    );
    assert_eq!(payment_status(&app, "PSP_RF").await.0, "succeeded");
    assert!(app.store().await.verify().await.unwrap().is_clean());
}

/// A refund heard before the authorisation it refunds (a capture of 600, refunded for
/// 300, its CAPTURE still in Adyen's retries): the refund proves only what was captured,
/// not the 1,000 authorised, so the payment does not stand again on the authorisation's
/// word. Its CAPTURE decides: then 3 tokens stand for the 300 kept.
#[tokio::test]
async fn a_refund_heard_before_the_authorisation_issues_nothing_until_the_capture() {
    let app = spawn_app_with(&adyen_manual()).await;
    let mut refund = modification("REFUND", "REF_E", "PSP_E", 300);
    refund["eventDate"] = json!("2026-11-30T17:00:00Z");
    send(&app, &[refund]).await;
    send(&app, &[authorisation("PSP_E", 10)]).await;
    assert!(
        app.active_indexes("PSP_E").await.is_empty(),
        "no capture recorded: nothing stands yet"
    );
    assert_eq!(payment_status(&app, "PSP_E").await.0, "refunded");

    send(
        &app,
        &[adyen_capture("CAP_E", "PSP_E", 600, "2026-11-30T15:00:00Z")],
    )
    .await;
    assert_eq!(app.active_indexes("PSP_E").await, vec![0, 1, 2]);
    assert_eq!(payment_status(&app, "PSP_E").await.0, "succeeded");
}
