//! Stripe manual capture: a PaymentIntent captured in part (`amount_received` below
//! `amount`) stands only for what was captured. Stripe releases the rest to the
//! cardholder and, since API version 2025-03-31, reports no refund for it: the success
//! itself says it, and the tokens it does not pay for are taken back as a refunded share
//! is, whichever of the success and the checkout's request comes first. A capture made
//! before that version also counted the release as a refund of the charge
//! (`charge.refunded`): counted once, whatever version the events are rendered in.

use mongodb::bson::doc;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::provider_events::*;

/// The API version of the events below, unless a test says otherwise.
const BASIL: &str = "2025-06-30.basil";

/// `payment_intent.succeeded` of 1000 cents buying 4 tokens, of which `received` were
/// captured.
fn captured(event_id: &str, payment: &str, received: i64) -> Value {
    captured_in(BASIL, event_id, payment, received, "4")
}

/// [`captured`] rendered in API `version`, its metadata naming `quantity` tokens.
fn captured_in(
    version: &str,
    event_id: &str,
    payment: &str,
    received: i64,
    quantity: &str,
) -> Value {
    let mut event = intent_event(event_id, "succeeded", payment, now(), quantity);
    event["api_version"] = version.into();
    event["data"]["object"]["amount_received"] = received.into();
    event["data"]["object"]["capture_method"] = "manual".into();
    event
}

/// `charge.refunded` of charge `ch_1` (1000 authorised, `captured` of it captured):
/// `amount_refunded` so far, `refunded` as Stripe says it.
fn charge_refunded(
    version: &str,
    event_id: &str,
    payment: &str,
    captured: i64,
    refunded: i64,
    whole: bool,
) -> Value {
    json!({
        "id": event_id, "object": "event", "type": "charge.refunded", "created": now(),
        "account": "acct_1", "api_version": version,
        "data": { "object": {
            "id": "ch_1", "object": "charge", "payment_intent": payment, "amount": 1000,
            "amount_captured": captured, "amount_refunded": refunded, "refunded": whole,
            "currency": "eur",
        } },
    })
}

/// Delivers `event`, signed, and checks it was answered 200.
async fn deliver(app: &TestApp, event: &Value) {
    let status = deliver_stripe(app, event).await.status();
    assert_eq!(status, 200, "{}", event["id"]);
}

/// (tokenIndex, status) of `payment`'s tokens.
async fn states(app: &TestApp, payment: &str) -> Vec<(i64, String)> {
    app.token_states(payment).await
}

fn half() -> Vec<(i64, String)> {
    indexed_statuses(&["active", "active", "revoked", "revoked"])
}

#[tokio::test]
async fn a_success_captured_in_part_issues_only_what_was_captured() {
    let app = app().await;
    let receipt = json(deliver_stripe(&app, &captured("evt_cap", "pi_cap", 500)).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(receipt["tokensCreated"], 4);
    // Written so from the start: the released half was never active.
    assert_eq!(states(&app, "pi_cap").await, half());
    let tokens = app.tokens_of("pi_cap").await;
    assert_eq!(tokens[2].get_str("revocationReason"), Ok("partial_refund"));
    assert_eq!(tokens[2].get_i32("_version"), Ok(0));
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_cap" })
        .await;
    assert_eq!(payment.get_str("status"), Ok("succeeded"));
    assert_eq!(
        stored_int(&payment, "amountRefunded"),
        Some(500),
        "{payment}"
    );

    // Delivered again under another event id (a retried `succeeded`): counted once.
    let again = json(deliver_stripe(&app, &captured("evt_cap_2", "pi_cap", 500)).await).await;
    assert_ne!(again["outcome"], "issued", "{again}");
    assert_eq!(states(&app, "pi_cap").await, half());
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_cap" })
        .await;
    assert_eq!(
        stored_int(&payment, "amountRefunded"),
        Some(500),
        "{payment}"
    );
}

#[tokio::test]
async fn a_checkout_issued_before_a_capture_in_part_gives_back_what_was_not_captured() {
    let app = app().await;
    let issued = app
        .issue(WRITER_KEY, &issuance_body("pi_cap_first", 4))
        .await;
    assert_eq!(issued.status(), 201);
    assert_eq!(
        states(&app, "pi_cap_first").await,
        indexed_statuses(&["active"; 4])
    );
    let receipt =
        json(deliver_stripe(&app, &captured("evt_cap_first", "pi_cap_first", 500)).await).await;
    assert_eq!(receipt["tokensRevoked"], 2, "{receipt}");
    assert_eq!(states(&app, "pi_cap_first").await, half());
}

#[tokio::test]
async fn a_success_captured_whole_takes_nothing_back() {
    let app = app().await;
    let receipt =
        json(deliver_stripe(&app, &captured("evt_cap_all", "pi_cap_all", 1000)).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(
        states(&app, "pi_cap_all").await,
        indexed_statuses(&["active"; 4])
    );
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_cap_all" })
        .await;
    assert!(payment.get("refunds").is_none(), "{payment}");
}

#[tokio::test]
async fn before_2025_03_31_the_release_is_the_charges_refund_and_counts_once() {
    // Then Stripe made the release a Refund of the charge: `charge.refunded` reports it
    // (500 of the 1000), whichever comes first.
    for (order, payment) in [("success first", "pi_old_1"), ("refund first", "pi_old_2")] {
        let app = app().await;
        let success = captured_in("2024-06-20", &format!("evt_{payment}"), payment, 500, "4");
        let release = charge_refunded(
            "2024-06-20",
            &format!("evt_{payment}_r"),
            payment,
            500,
            500,
            false,
        );
        let events = if order == "success first" {
            [success, release]
        } else {
            [release, success]
        };
        for event in &events {
            deliver(&app, event).await;
        }
        assert_eq!(states(&app, payment).await, half(), "{order}");
        assert_eq!(
            payment_status(&app, payment).await.0,
            "succeeded",
            "{order}"
        );
    }
}

#[tokio::test]
async fn a_capture_that_made_no_refund_is_taken_back_whatever_the_events_version() {
    // The capture's request was made in 2025-03-31 or later (an SDK pins its own
    // version), so Stripe made no Refund of the release; the webhook endpoint still
    // renders its events in 2024-06-20. No `charge.refunded` tells the release: the
    // success does, in its own version too.
    let app = app().await;
    let payment = "pi_sdk_newer";
    let success = captured_in("2024-06-20", "evt_sdk_newer", payment, 500, "4");
    let receipt = json(deliver_stripe(&app, &success).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(states(&app, payment).await, half());
    // A refund of 250 of the 500 captured: less than the 500 released, so the charge's
    // total cannot hold the release, and 750 of the 1000 are withdrawn.
    let refund = charge_refunded("2024-06-20", "evt_sdk_newer_r", payment, 500, 250, false);
    deliver(&app, &refund).await;
    assert_eq!(app.active_indexes(payment).await.len(), 1);
    assert_eq!(payment_status(&app, payment).await.0, "succeeded");
    let stored = app
        .find_stored("payments", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(stored_int(&stored, "amountRefunded"), Some(750), "{stored}");
}

#[tokio::test]
async fn a_release_the_charge_counted_as_a_refund_counts_once_whatever_the_events_version() {
    // The capture's request was made before 2025-03-31, so the release of 600 is a
    // Refund of the charge; the endpoint renders events in a later version, whose
    // success reports the release too. Counted once, in either order.
    for (order, payment) in [
        ("success first", "pi_sdk_older_1"),
        ("refund first", "pi_sdk_older_2"),
    ] {
        let app = app().await;
        let success = captured_in(BASIL, &format!("evt_{payment}"), payment, 400, "10");
        let release = charge_refunded(BASIL, &format!("evt_{payment}_r"), payment, 400, 600, false);
        let events = if order == "success first" {
            [success, release]
        } else {
            [release, success]
        };
        for event in &events {
            deliver(&app, event).await;
        }
        assert_eq!(app.active_indexes(payment).await.len(), 4, "{order}");
        assert_eq!(
            payment_status(&app, payment).await.0,
            "succeeded",
            "{order}"
        );
        let stored = app
            .find_stored("payments", doc! { "paymentIntentId": payment })
            .await;
        let charge = stored
            .get_array("refunds")
            .unwrap()
            .iter()
            .filter_map(|entry| entry.as_document())
            .find(|entry| entry.get_str("id") == Ok("charge:ch_1"))
            .unwrap_or_else(|| panic!("{order}: {stored}"))
            .clone();
        let release = charge.get_document("release").unwrap();
        assert_eq!(release.get_bool("held"), Ok(true), "{order}: {stored}");
        // Then a refund of 100 of what was captured: the charge's total grows to 700.
        let refund = charge_refunded(
            BASIL,
            &format!("evt_{payment}_r2"),
            payment,
            400,
            700,
            false,
        );
        deliver(&app, &refund).await;
        assert_eq!(app.active_indexes(payment).await.len(), 3, "{order}");
        // That refund fails: its 100 comes back, and the release still counts once.
        let failed = refund_failed(&format!("evt_{payment}_f"), payment, "re_1", 100);
        deliver(&app, &failed).await;
        assert_eq!(app.active_indexes(payment).await.len(), 4, "{order}");
    }
}

/// `refund.failed` of Refund `refund` (`amount`) of charge `ch_1`.
fn refund_failed(event_id: &str, payment: &str, refund: &str, amount: i64) -> Value {
    json!({
        "id": event_id, "object": "event", "type": "refund.failed", "created": now(),
        "account": "acct_1", "api_version": BASIL,
        "data": { "object": {
            "id": refund, "object": "refund", "amount": amount, "charge": "ch_1",
            "currency": "eur", "payment_intent": payment, "status": "failed",
            "failure_reason": "expired_or_canceled_card",
        } },
    })
}

#[tokio::test]
async fn a_total_once_shown_to_hold_no_release_is_never_guessed_to_hold_it() {
    // The capture was made since 2025-03-31 (no Refund of the 300 released); the
    // endpoint renders 2024-06-20, whose version would guess that the charge's total
    // holds the release. A report below the release proves it does not, and that stays
    // when later reports land where the amounts cannot tell.
    let app = app().await;
    let payment = "pi_proof";
    let success = captured_in("2024-06-20", "evt_proof", payment, 700, "10");
    deliver(&app, &success).await;
    assert_eq!(
        app.active_indexes(payment).await.len(),
        7,
        "300 of 1000 released"
    );
    let steps = [(100, 6), (350, 4), (700, 0)];
    for (refunded, standing) in steps {
        let report = charge_refunded(
            "2024-06-20",
            &format!("evt_proof_{refunded}"),
            payment,
            700,
            refunded,
            refunded == 700,
        );
        deliver(&app, &report).await;
        assert_eq!(
            app.active_indexes(payment).await.len(),
            standing,
            "refunded {refunded}"
        );
    }
}

#[tokio::test]
async fn a_charge_captured_in_part_refunded_whole_then_given_back_stands_for_its_capture() {
    let app = app().await;
    let payment = "pi_cap_refunded";
    deliver_stripe(&app, &captured("evt_cr", payment, 500)).await;
    assert_eq!(states(&app, payment).await, half());
    // All it captured refunded: `refunded: true` of 500, with the release the whole.
    let refunded = charge_refunded(BASIL, "evt_cr_r", payment, 500, 500, true);
    deliver(&app, &refunded).await;
    assert_eq!(
        states(&app, payment).await,
        indexed_statuses(&["revoked"; 4])
    );
    assert_eq!(payment_status(&app, payment).await.0, "refunded");
    // That refund failed: the 500 captured came back, and so do the 2 tokens they pay.
    let failed = json!({
        "id": "evt_cr_f", "object": "event", "type": "refund.failed", "created": now(),
        "account": "acct_1", "api_version": BASIL,
        "data": { "object": {
            "id": "re_1", "object": "refund", "amount": 500, "charge": "ch_1",
            "currency": "eur", "payment_intent": payment, "status": "failed",
            "failure_reason": "expired_or_canceled_card",
        } },
    });
    deliver(&app, &failed).await;
    assert_eq!(states(&app, payment).await, half());
    assert_eq!(payment_status(&app, payment).await.0, "succeeded");
}

#[tokio::test]
async fn a_release_reported_by_a_success_held_back_is_taken_back_all_the_same() {
    // The session fixed the parameters (4 tokens); the PaymentIntent's success names
    // others, so it is held back (`metadata_conflict`), but the money it reports
    // released is taken back.
    let app = app().await;
    let payment = "pi_cap_conflict";
    let metadata = json!({ "tokenmint_owner": OWNER, "tokenmint_token_type": "standard",
        "tokenmint_quantity": "4" });
    let session = session_event("evt_cs_cap", "completed", payment, "paid", now(), metadata);
    deliver(&app, &session).await;
    assert_eq!(
        states(&app, payment).await,
        indexed_statuses(&["active"; 4])
    );
    let success = captured_in(BASIL, "evt_cap_conflict", payment, 500, "2");
    let receipt = json(deliver_stripe(&app, &success).await).await;
    assert_eq!(receipt["outcome"], "metadata_conflict", "{receipt}");
    assert_eq!(states(&app, payment).await, half());
}

#[tokio::test]
async fn a_success_whose_release_cannot_be_recorded_writes_nothing_until_sent_again() {
    // Recording the release fails (both of the driver's tries): the event is answered
    // 5xx before anything of the payment is projected or issued, and Stripe's
    // redelivery issues it as if it came first.
    let name = unique_app_name();
    let app = spawn_app_named(&name, PROVIDERS).await;
    let payments = format!("{}.payments", app.db_name);
    let event = captured("evt_cap_fail", "pi_cap_fail", 500);
    let failpoint =
        FailPoint::set_on(&name, &["findAndModify"], &payments, Fault::error(91), 2).await;
    let answer = deliver_stripe(&app, &event).await;
    assert!(failpoint.off().await > 0, "the release was never refused");
    assert!(answer.status().is_server_error(), "{}", answer.status());
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count("payments", doc! {}).await, 0);
    let receipt = json(deliver_stripe(&app, &event).await).await;
    assert_eq!(receipt["outcome"], "issued", "{receipt}");
    assert_eq!(states(&app, "pi_cap_fail").await, half());
}

#[tokio::test]
async fn a_charge_refunded_whole_for_less_than_its_amount_holds_no_release() {
    // The capture was made since 2025-03-31; the endpoint renders 2024-06-20. All 700
    // captured is refunded: `refunded: true` at 700 of 1000, which a total holding the
    // release of 300 would report as 1000. Every token is taken back.
    let app = app().await;
    let payment = "pi_whole";
    let success = captured_in("2024-06-20", "evt_whole", payment, 700, "10");
    deliver(&app, &success).await;
    let refunded = charge_refunded("2024-06-20", "evt_whole_r", payment, 700, 700, true);
    deliver(&app, &refunded).await;
    assert_eq!(app.active_indexes(payment).await.len(), 0);
    assert_eq!(payment_status(&app, payment).await.0, "refunded");
}

#[tokio::test]
async fn a_report_made_between_the_parts_of_a_capture_proves_nothing_of_the_last() {
    // Captured in parts before 2025-03-31 (multicapture): 300, a refund of 100, then the
    // last part to 800 and the release of the other 200 as a Refund of the charge. The
    // first report (100 refunded of 300 captured) is below what was still capturable,
    // but says nothing of the last capture's release, which the second report holds.
    let app = app().await;
    let payment = "pi_parts";
    let between = charge_refunded("2024-06-20", "evt_parts_r1", payment, 300, 100, false);
    deliver(&app, &between).await;
    let mut last = charge_refunded("2024-06-20", "evt_parts_r2", payment, 800, 300, false);
    last["created"] = json!(now() + 1);
    deliver(&app, &last).await;
    let success = captured_in("2024-06-20", "evt_parts", payment, 800, "10");
    deliver(&app, &success).await;
    // 200 released and 100 refunded of 1000: 7 of 10 stand.
    assert_eq!(app.active_indexes(payment).await.len(), 7);

    // 600 captured, 450 refunded; the last part brings it to 700, and its success comes
    // before the charge's next report: the 400 the first report saw uncaptured was never
    // released, only the last 300 were. 450 and 300 of 1000: 3 of 10 stand.
    let payment = "pi_parts_2";
    let between = charge_refunded("2024-06-20", "evt_parts2_r1", payment, 600, 450, false);
    deliver(&app, &between).await;
    let success = captured_in("2024-06-20", "evt_parts2", payment, 700, "10");
    deliver(&app, &success).await;
    assert_eq!(app.active_indexes(payment).await.len(), 3);
}

#[tokio::test]
async fn the_guess_is_the_first_report_of_the_capture_whatever_order_they_arrive_in() {
    // Captured 700 of 1000 before 2025-03-31, the endpoint then on the same side: the
    // charge's total holds the release of 300. Its first report (300) proves nothing
    // and guesses right. The endpoint is upgraded, and a refund of 100 is reported in the
    // new version (400, proving nothing either): the guess stays the first report's,
    // in either order of arrival.
    for (order, payment) in [("in order", "pi_guess_1"), ("late first", "pi_guess_2")] {
        let app = app().await;
        let success = captured_in("2024-06-20", &format!("evt_{payment}"), payment, 700, "10");
        deliver(&app, &success).await;
        let first = charge_refunded(
            "2024-06-20",
            &format!("evt_{payment}_1"),
            payment,
            700,
            300,
            false,
        );
        let mut upgraded =
            charge_refunded(BASIL, &format!("evt_{payment}_2"), payment, 700, 400, false);
        upgraded["created"] = json!(now() + 5);
        let reports = if order == "in order" {
            [first, upgraded]
        } else {
            [upgraded, first]
        };
        for report in &reports {
            deliver(&app, report).await;
        }
        // 300 released and 100 refunded: 6 of 10 stand.
        assert_eq!(app.active_indexes(payment).await.len(), 6, "{order}");
    }
}

#[tokio::test]
async fn a_report_that_says_nothing_of_the_release_keeps_what_the_others_said() {
    // A report of the charge without `amount_captured` says nothing of the release: the
    // entry keeps the earlier report's proof that its total holds it.
    let app = app().await;
    let payment = "pi_silent";
    let success = captured_in(BASIL, "evt_silent", payment, 400, "10");
    deliver(&app, &success).await;
    let release = charge_refunded(BASIL, "evt_silent_1", payment, 400, 600, false);
    deliver(&app, &release).await;
    assert_eq!(app.active_indexes(payment).await.len(), 4);
    let mut silent = charge_refunded(BASIL, "evt_silent_2", payment, 400, 700, false);
    silent["data"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("amount_captured");
    silent["created"] = json!(now() + 1);
    deliver(&app, &silent).await;
    // 600 released and 100 refunded: 3 of 10 stand.
    assert_eq!(app.active_indexes(payment).await.len(), 3);
}

#[tokio::test]
async fn a_charge_report_whose_write_fails_counts_its_release_once_when_sent_again() {
    // The success recorded the release (600 of 1000); the charge's report, whose total
    // holds it, fails to be written (both of the driver's tries): 5xx, the payment as it
    // was, and Stripe's redelivery counts the release once.
    let name = unique_app_name();
    let app = spawn_app_named(&name, PROVIDERS).await;
    let payment = "pi_report_fail";
    deliver(&app, &captured_in(BASIL, "evt_rf", payment, 400, "10")).await;
    assert_eq!(app.active_indexes(payment).await.len(), 4);
    let report = charge_refunded(BASIL, "evt_rf_r", payment, 400, 700, false);
    let payments = format!("{}.payments", app.db_name);
    let failpoint =
        FailPoint::set_on(&name, &["findAndModify"], &payments, Fault::error(91), 2).await;
    let answer = deliver_stripe(&app, &report).await;
    assert!(failpoint.off().await > 0, "the report was never refused");
    assert!(answer.status().is_server_error(), "{}", answer.status());
    assert_eq!(app.active_indexes(payment).await.len(), 4);
    deliver(&app, &report).await;
    // 600 released and 100 refunded: 3 of 10 stand.
    assert_eq!(app.active_indexes(payment).await.len(), 3);
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}
