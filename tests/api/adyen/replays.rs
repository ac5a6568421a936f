//! Adyen signs neither `eventDate` nor `additionalData` (where the token metadata is),
//! and a dedupe record expires: a correctly signed item can come back later with those
//! changed. Such a replay is answered `[accepted]`, recorded with its outcome, and changes
//! nothing in `payments`, `issuances` or `tokens`.

use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use super::{ADYEN, ADYEN_NEW, authorisation, modification, post_batch, send, signed_batch};
use crate::helpers::*;
use crate::provider_events::{payment_state, recorded_outcome};

/// The dedupe record of `event_id` expires (`webhooks.retention_days`).
async fn expire(app: &TestApp, event_id: &str) {
    let deleted = app
        .db
        .collection::<Document>("webhook_events")
        .delete_one(doc! { "eventId": event_id })
        .await
        .unwrap();
    assert_eq!(deleted.deleted_count, 1, "{event_id} was recorded");
}

/// `body` (one signed item) with its unsigned fields changed: a later `eventDate` and the
/// metadata of `quantity` tokens for [`OWNER`] — the `hmacSignature` is kept as it was.
fn tampered(body: &[u8], event_date: &str, quantity: i64) -> Vec<u8> {
    let mut batch: Value = serde_json::from_slice(body).unwrap();
    let item = &mut batch["notificationItems"][0]["NotificationRequestItem"];
    item["eventDate"] = json!(event_date);
    let data = item["additionalData"].as_object_mut().unwrap();
    data.insert("metadata.tokenmint_owner".to_owned(), json!(OWNER));
    data.insert(
        "metadata.tokenmint_token_type".to_owned(),
        json!("standard"),
    );
    data.insert(
        "metadata.tokenmint_quantity".to_owned(),
        json!(quantity.to_string()),
    );
    batch.to_string().into_bytes()
}

async fn accepted(app: &TestApp, body: Vec<u8>) {
    let answer = post_batch(app, body).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "[accepted]");
}

#[tokio::test]
async fn a_canceled_authorisation_replayed_with_metadata_after_its_record_expired_issues_nothing() {
    let app = spawn_app_with(ADYEN).await;
    let mut bare = authorisation("PSP_X", 1);
    bare["additionalData"] = json!({});
    let signed = signed_batch(&[bare], ADYEN_NEW);
    accepted(&app, signed.clone()).await;
    send(
        &app,
        &[modification("CANCELLATION", "PSP_C", "PSP_X", 1000)],
    )
    .await;
    expire(&app, "AUTHORISATION:PSP_X:true").await;
    let before = payment_state(&app).await;

    accepted(&app, tampered(&signed, "2026-11-30T14:00:00+01:00", 4)).await;

    assert_eq!(payment_state(&app).await, before, "nothing changed");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_X" })
        .await;
    assert_eq!(payment.get_str("status").unwrap(), "canceled");
    assert_eq!(
        recorded_outcome(&app, "AUTHORISATION:PSP_X:true").await,
        "metadata_conflict",
        "older than the cancellation, which outranks every success, and naming metadata"
    );
}

#[tokio::test]
async fn an_authorisation_replayed_with_other_metadata_is_a_metadata_conflict() {
    let app = spawn_app_with(ADYEN).await;
    let signed = signed_batch(&[authorisation("PSP_M", 2)], ADYEN_NEW);
    accepted(&app, signed.clone()).await;
    assert_eq!(app.count("tokens", doc! {}).await, 2);
    expire(&app, "AUTHORISATION:PSP_M:true").await;
    let before = payment_state(&app).await;

    // Later or earlier than the first: the parameters are the first success's either way.
    for date in ["2026-11-30T14:00:00+01:00", "2026-11-30T08:00:00+01:00"] {
        accepted(&app, tampered(&signed, date, 4)).await;
        assert_eq!(
            payment_state(&app).await,
            before,
            "nothing changed ({date})"
        );
        assert_eq!(
            recorded_outcome(&app, "AUTHORISATION:PSP_M:true").await,
            "metadata_conflict"
        );
        expire(&app, "AUTHORISATION:PSP_M:true").await;
    }
    assert_eq!(app.count("tokens", doc! {}).await, 2);
}

/// Under manual capture the AUTHORISATION carries the parameters and the CAPTURE names
/// none: the authorisation fixes them, so a replay of it with other metadata (after its
/// dedupe record expired, before the capture) cannot choose what the capture issues.
#[tokio::test]
async fn under_manual_capture_a_replayed_authorisation_cannot_change_what_the_capture_issues() {
    let app = spawn_app_with(&format!("{ADYEN}capture = \"manual\"\n")).await;
    let signed = signed_batch(&[authorisation("PSP_R", 3)], ADYEN_NEW);
    accepted(&app, signed.clone()).await;
    expire(&app, "AUTHORISATION:PSP_R:true").await;
    accepted(&app, tampered(&signed, "2026-11-30T12:00:00+01:00", 9)).await;
    assert_eq!(
        recorded_outcome(&app, "AUTHORISATION:PSP_R:true").await,
        "metadata_conflict"
    );

    send(&app, &[modification("CAPTURE", "CAP_R", "PSP_R", 1000)]).await;
    assert_eq!(app.token_indexes("PSP_R").await, vec![0, 1, 2]);
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_R" })
        .await;
    assert_eq!(
        stored_int(payment.get_document("tokenParams").unwrap(), "quantity"),
        Some(3)
    );
}

/// An authorisation without token metadata (an ordinary sale, or a checkout whose
/// request the success did not name) or with unusable metadata fixes the parameters all
/// the same: it is the one item of a payment that carries them, so a replay of it with
/// metadata added, the same date or a later one, mints nothing.
#[tokio::test]
async fn an_authorisation_without_usable_metadata_replayed_with_some_mints_nothing() {
    let app = spawn_app_with(ADYEN).await;
    let mut bare = authorisation("PSP_BARE", 1);
    bare["additionalData"] = json!({});
    let mut unusable = authorisation("PSP_BAD", 1);
    unusable["additionalData"]["metadata.tokenmint_quantity"] = json!("many");
    for (item, outcome) in [(bare, "no_metadata"), (unusable, "metadata_invalid")] {
        let psp = item["pspReference"].as_str().unwrap().to_owned();
        let event_id = format!("AUTHORISATION:{psp}:true");
        let signed = signed_batch(&[item], ADYEN_NEW);
        accepted(&app, signed.clone()).await;
        assert_eq!(recorded_outcome(&app, &event_id).await, outcome);

        for date in ["2026-11-30T10:00:00+01:00", "2026-11-30T14:00:00+01:00"] {
            expire(&app, &event_id).await;
            let before = payment_state(&app).await;
            accepted(&app, tampered(&signed, date, 4)).await;
            assert_eq!(payment_state(&app).await, before, "{psp} changed ({date})");
            assert_eq!(
                recorded_outcome(&app, &event_id).await,
                "metadata_conflict",
                "{psp} ({date})"
            );
        }
        let payment = app
            .find_stored("payments", doc! { "paymentIntentId": psp.as_str() })
            .await;
        assert!(
            payment
                .get("tokenParams")
                .is_none_or(|p| p.as_null().is_some()),
            "{payment}"
        );
    }
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
}

/// The signature covers the fields joined with `:`, so a capture of 400 whose
/// `merchantReference` holds a colon (`cap:99999`) signs the very text a capture of
/// 99999 in currency `400:EUR` would. Sent again that way once its dedupe record expired,
/// it is refused as unsigned: the capture stays 400 and the tokens it did not pay for
/// stay revoked.
#[tokio::test]
async fn a_capture_replayed_with_its_fields_shifted_along_the_colons_is_refused() {
    let app = spawn_app_with(&format!("{ADYEN}capture = \"manual\"\n")).await;
    send(&app, &[authorisation("PSP_S", 10)]).await;
    let mut capture = modification("CAPTURE", "CAP_S", "PSP_S", 400);
    capture["merchantReference"] = json!("cap:99999");
    let signed = signed_batch(&[capture], ADYEN_NEW);
    accepted(&app, signed.clone()).await;
    assert_eq!(app.active_indexes("PSP_S").await, vec![0, 1, 2, 3]);
    expire(&app, "CAPTURE:CAP_S:true").await;
    let before = payment_state(&app).await;

    let mut shifted: Value = serde_json::from_slice(&signed).unwrap();
    let item = &mut shifted["notificationItems"][0]["NotificationRequestItem"];
    item["merchantReference"] = json!("cap");
    item["amount"] = json!({ "value": 99999, "currency": "400:EUR" });
    let answer = post_batch(&app, shifted.to_string().into_bytes()).await;
    assert_problem(answer, 401, "signature_invalid").await;

    assert_eq!(payment_state(&app).await, before, "nothing changed");
    assert_eq!(app.active_indexes("PSP_S").await, vec![0, 1, 2, 3]);
    assert_eq!(app.count("tokens", doc! {}).await, 10);
}

/// `eventDate` is not signed. An authorisation sent again (its dedupe record expired)
/// dated far ahead does not pin the payment: the cancellation that follows still takes
/// every token, since a cancellation outranks every success whatever the dates.
#[tokio::test]
async fn an_authorisation_replayed_dated_ahead_does_not_make_a_later_cancellation_stale() {
    let app = spawn_app_with(ADYEN).await;
    let signed = signed_batch(&[authorisation("PSP_F", 2)], ADYEN_NEW);
    accepted(&app, signed.clone()).await;
    expire(&app, "AUTHORISATION:PSP_F:true").await;
    let mut ahead: Value = serde_json::from_slice(&signed).unwrap();
    ahead["notificationItems"][0]["NotificationRequestItem"]["eventDate"] =
        json!("2200-01-01T00:00:00+00:00");
    accepted(&app, ahead.to_string().into_bytes()).await;
    assert_eq!(app.active_indexes("PSP_F").await, vec![0, 1]);

    send(
        &app,
        &[modification("CANCELLATION", "CAN_F", "PSP_F", 1000)],
    )
    .await;
    assert_eq!(
        recorded_outcome(&app, "CANCELLATION:CAN_F:true").await,
        "recorded"
    );
    assert_eq!(app.active_indexes("PSP_F").await, Vec::<i64>::new());
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "PSP_F" })
        .await;
    assert_eq!(payment.get_str("status").unwrap(), "canceled");
}

/// A copy of a genuine refund with its (unsigned) `eventDate` made unreadable, sent
/// before the genuine delivery, is ignored apart from the refund's own id: the genuine
/// refund that follows is applied, not taken for a duplicate.
#[tokio::test]
async fn a_copy_with_an_unreadable_date_does_not_stand_for_the_genuine_item() {
    let app = spawn_app_with(ADYEN).await;
    send(&app, &[authorisation("PSP_D", 2)]).await;
    let refund = signed_batch(&[modification("REFUND", "REF_D", "PSP_D", 1000)], ADYEN_NEW);
    let mut undated: Value = serde_json::from_slice(&refund).unwrap();
    undated["notificationItems"][0]["NotificationRequestItem"]["eventDate"] = json!("soon");
    accepted(&app, undated.to_string().into_bytes()).await;
    assert_eq!(app.active_indexes("PSP_D").await, vec![0, 1]);
    assert_eq!(
        recorded_outcome(&app, "REFUND:REF_D:true#eventDate").await,
        "ignored"
    );

    accepted(&app, refund).await;
    assert_eq!(recorded_outcome(&app, "REFUND:REF_D:true").await, "revoked");
    assert_eq!(app.active_indexes("PSP_D").await, Vec::<i64>::new());
}
