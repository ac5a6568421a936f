//! A refund holds its payment's place in `issuances`, which orders it against an atomic
//! issuance that read the payment before the refund was recorded: the hold waits for
//! the issuance's uncommitted record (and the refund's revoke then sees its tokens), or it
//! leaves a placeholder that stops the issuance's transaction. A placeholder is no record:
//! reads, `GET` and `verify` skip it, and whoever claims the payment later takes it over
//! in place. A pending record a hold finds is kept at least as long as a placeholder.

use std::time::Duration;

use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use serde_json::json;
use tokenmint::domain::IssuanceStatus;
use tokenmint::store::{AtomicSetsInsert, IssuanceDoc};

use crate::helpers::*;
use crate::provider_events::*;

/// What `issuances` holds for `payment`, placeholder or record.
async fn place_of(app: &TestApp, payment: &str) -> Document {
    app.find_stored("issuances", doc! { "paymentIntentId": payment })
        .await
}

/// The placeholder of `payment`: its `_id`, after checking its shape (no token
/// parameters, an expiry about an hour ahead).
async fn placeholder_of(app: &TestApp, payment: &str) -> ObjectId {
    let place = place_of(app, payment).await;
    assert_eq!(place.get_str("status").unwrap(), "placeholder", "{place}");
    for field in ["owner", "tokenType", "quantity"] {
        assert!(!place.contains_key(field), "{field} in {place}");
    }
    let expires = place.get_datetime("expiresAt").unwrap().timestamp_millis();
    let ahead = expires - DateTime::now().timestamp_millis();
    assert!(
        (50 * 60_000..=61 * 60_000).contains(&ahead),
        "expires in {ahead} ms: {place}"
    );
    place.get_object_id("_id").unwrap()
}

#[tokio::test]
async fn a_refund_after_the_issuances_payment_read_stops_its_transaction() {
    let app = app().await;
    let store = app.store().await;
    // The batch read the payment while nothing was known of it; then the refund was
    // recorded and held the payment's place; then the transaction inserts.
    let delivered = deliver_stripe(&app, &refund_event("evt_ph_r", "pi_ph_stale", now())).await;
    assert_eq!(delivered.status(), 200);
    let placeholder = placeholder_of(&app, "pi_ph_stale").await;

    let request = atomic_issuance("pi_ph_stale", 3);
    let record = IssuanceDoc::new(&request, IssuanceStatus::Issued);
    let inserted = store
        .insert_sets_atomically(&[(&record, &request)], async {
            Ok(Ok::<_, ()>(Vec::new()))
        })
        .await
        .unwrap();
    assert!(
        matches!(inserted, AtomicSetsInsert::RecordExists),
        "{inserted:?}"
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(app.count_records(doc! {}).await, 0);
    assert_eq!(placeholder_of(&app, "pi_ph_stale").await, placeholder);

    // A request through the service is refused, and the placeholder is no issuance.
    let mut body = issuance_body("pi_ph_stale", 3);
    body["mode"] = json!("atomic");
    assert_problem(
        app.issue(WRITER_KEY, &body).await,
        409,
        "payment_not_succeeded",
    )
    .await;
    let got = app
        .get(READER_KEY, "/v1/issuances/stripe/acct_1/pi_ph_stale")
        .await;
    assert_eq!(got.status(), 404);
    let report = store.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.issuances_checked, 0, "{report}");
}

#[tokio::test]
async fn a_hold_waits_for_an_uncommitted_record_and_returns_it_unchanged() {
    let app = app().await;
    let store = app.store().await;
    let request = atomic_issuance("pi_ph_inflight", 2);
    let record = IssuanceDoc::new(&request, IssuanceStatus::Issued);

    let client = app.db.client().clone();
    let mut session = client.start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    app.db
        .collection::<IssuanceDoc>("issuances")
        .insert_one(&record)
        .session(&mut session)
        .await
        .unwrap();

    let key = request.key.clone();
    let hold = tokio::spawn({
        let store = store.clone();
        async move { store.hold_place(&key).await }
    });
    // The test runs on one thread: the hold's upsert is sent during this sleep, and an
    // upsert that did not wait would answer within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !hold.is_finished(),
        "the hold must wait for the transaction that inserted the record"
    );
    session.commit_transaction().await.unwrap();

    let held = hold.await.unwrap().unwrap().expect("the committed record");
    assert_eq!(held.id, record.id);
    let place = place_of(&app, "pi_ph_inflight").await;
    assert_eq!(place.get_str("status").unwrap(), "issued", "{place}");
    assert!(
        !place.contains_key("expiresAt"),
        "a record never expires: {place}"
    );
}

#[tokio::test]
async fn an_issuance_after_a_partial_refund_takes_the_placeholder_over_in_both_modes() {
    let app = app().await;
    let t = now();
    for mode in ["upsert", "atomic"] {
        let payment = format!("pi_ph_partial_{mode}");
        // Half refunded before anyone issued: the payment still stands for half.
        stripe_ok(
            &app,
            &partial_refund_event(&format!("evt_{mode}_r"), &payment, t + 10, 1000, 500),
        )
        .await;
        let placeholder = placeholder_of(&app, &payment).await;

        let mut body = issuance_body(&payment, 4);
        body["mode"] = json!(mode);
        let answer = app.issue(WRITER_KEY, &body).await;
        assert_eq!(answer.status(), 201, "{mode}");
        let place = place_of(&app, &payment).await;
        assert_eq!(place.get_object_id("_id").unwrap(), placeholder, "{mode}");
        assert_eq!(
            place.get_str("status").unwrap(),
            "issued",
            "{mode}: {place}"
        );
        assert_eq!(stored_int(&place, "quantity"), Some(4), "{mode}");
        assert!(!place.contains_key("expiresAt"), "{mode}: {place}");
        assert_eq!(
            app.token_states(&payment).await,
            indexed_statuses(&["active", "active", "revoked", "revoked"]),
            "{mode}"
        );
    }
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn a_checkout_request_after_a_partial_refund_takes_the_placeholder_over() {
    let app = app().await;
    let t = now();
    stripe_ok(
        &app,
        &partial_refund_event("evt_ph_c_r", "pi_ph_checkout", t + 10, 1000, 250),
    )
    .await;
    let placeholder = placeholder_of(&app, "pi_ph_checkout").await;

    let pending = app
        .issue(REQUEST_KEY, &issuance_body("pi_ph_checkout", 4))
        .await;
    assert_eq!(pending.status(), 202);
    let place = place_of(&app, "pi_ph_checkout").await;
    assert_eq!(place.get_object_id("_id").unwrap(), placeholder);
    assert_eq!(place.get_str("status").unwrap(), "pending", "{place}");

    // The success event fulfils it, with the refunded quarter taken back.
    stripe_ok(
        &app,
        &intent_event("evt_ph_c_ok", "succeeded", "pi_ph_checkout", t, "4"),
    )
    .await;
    assert_eq!(
        app.token_states("pi_ph_checkout").await,
        indexed_statuses(&["active", "active", "active", "revoked"])
    );
    let record = place_of(&app, "pi_ph_checkout").await;
    assert_eq!(record.get_object_id("_id").unwrap(), placeholder);
    assert_eq!(record.get_str("status").unwrap(), "issued", "{record}");
}

#[tokio::test]
async fn a_hold_keeps_a_pending_record_at_least_as_long_as_a_placeholder() {
    let app = app().await;
    let store = app.store().await;
    let pending = app
        .issue(REQUEST_KEY, &issuance_body("pi_ph_pending", 2))
        .await;
    assert_eq!(pending.status(), 202);
    // A pending record about to expire: a batch that read the payment before a refund
    // could otherwise find its place free again once the TTL monitor removes it.
    let soon = DateTime::from_millis(DateTime::now().timestamp_millis() + 5_000);
    set_expiry(&app, "pi_ph_pending", soon).await;

    let held = store
        .hold_place(&atomic_issuance("pi_ph_pending", 2).key)
        .await
        .unwrap()
        .expect("the pending record");
    assert_eq!(held.status, IssuanceStatus::Pending);
    let place = place_of(&app, "pi_ph_pending").await;
    assert_eq!(place.get_str("status").unwrap(), "pending", "{place}");
    let ahead = place.get_datetime("expiresAt").unwrap().timestamp_millis()
        - DateTime::now().timestamp_millis();
    assert!(
        (50 * 60_000..=61 * 60_000).contains(&ahead),
        "expires in {ahead} ms: {place}"
    );

    // A later expiry is never shortened.
    let later = DateTime::from_millis(DateTime::now().timestamp_millis() + 86_400_000);
    set_expiry(&app, "pi_ph_pending", later).await;
    store
        .hold_place(&atomic_issuance("pi_ph_pending", 2).key)
        .await
        .unwrap();
    let place = place_of(&app, "pi_ph_pending").await;
    assert_eq!(place.get_datetime("expiresAt").unwrap(), &later, "{place}");
}

/// Sets the expiry of what `issuances` holds for `payment`, as if written long ago.
async fn set_expiry(app: &TestApp, payment: &str, at: DateTime) {
    app.db
        .collection::<Document>("issuances")
        .update_one(
            doc! { "paymentIntentId": payment },
            doc! { "$set": { "expiresAt": at } },
        )
        .await
        .unwrap();
}

async fn stripe_ok(app: &TestApp, event: &serde_json::Value) {
    let delivered = deliver_stripe(app, event).await;
    assert_eq!(delivered.status(), 200, "{event}");
}
