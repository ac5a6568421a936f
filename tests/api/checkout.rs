//! Checkout keys (`issuances:request`): what a public frontend key may ask for, how long
//! its pending request lives, and what it is never told.

use chrono::Utc;
use futures::TryStreamExt;
use std::time::Duration;

use mongodb::IndexModel;
use mongodb::bson::{Bson, Document, doc, oid::ObjectId};
use serde_json::json;

use crate::helpers::*;
use crate::provider_events::*;

async fn record(app: &TestApp, payment: &str) -> Option<Document> {
    app.db
        .collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
}

/// Asserts `expiresAt` of `payment`'s pending record is `days` from now (a minute either
/// way, for a slow machine).
async fn assert_expires_in_days(app: &TestApp, payment: &str, days: i64) {
    let record = record(app, payment).await.expect("a pending record");
    assert_eq!(record.get_str("status").unwrap(), "pending");
    let expires = record
        .get_datetime("expiresAt")
        .unwrap_or_else(|_| panic!("pending record without expiresAt: {record}"))
        .timestamp_millis();
    let expected = Utc::now().timestamp_millis() + days * 86_400_000;
    assert!(
        (expires - expected).abs() < 60_000,
        "expiresAt {expires} is not {days} day(s) from now ({expected})"
    );
}

#[tokio::test]
async fn checkout_keys_may_only_name_a_configured_provider() {
    let app = app().await;
    let mut body = issuance_body("pi_elsewhere", 1);
    body["provider"] = json!("paypal");
    let refused = assert_problem(
        app.issue(REQUEST_KEY, &body).await,
        422,
        "validation_failed",
    )
    .await;
    let errors = refused["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{refused}");
    assert_eq!(errors[0]["field"], "provider", "{refused}");
    // Listed with the body's other bad fields, not in a second 422 once they are mended.
    let mut also_bad = body.clone();
    also_bad["quantity"] = json!(0);
    let refused = assert_problem(
        app.issue(REQUEST_KEY, &also_bad).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(
        error_fields(&refused),
        ["provider", "quantity"],
        "{refused}"
    );
    assert_eq!(app.count("issuances", doc! {}).await, 0);
    assert_eq!(app.count("tokens", doc! {}).await, 0);

    // Both configured providers are accepted (pending: the payments are unknown yet).
    body["provider"] = json!("acme");
    assert_eq!(app.issue(REQUEST_KEY, &body).await.status(), 202);
    assert_eq!(
        app.issue(REQUEST_KEY, &issuance_body("pi_here", 1))
            .await
            .status(),
        202
    );
    assert_eq!(
        app.count("issuances", doc! { "status": "pending" }).await,
        2
    );

    // "Configured" means configured on this instance: without providers, stripe is refused.
    let bare = spawn_app().await;
    let refused = assert_problem(
        bare.issue(REQUEST_KEY, &issuance_body("pi_here", 1)).await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(refused["errors"][0]["field"], "provider");
    assert_eq!(bare.count("issuances", doc! {}).await, 0);
}

#[tokio::test]
async fn a_pending_request_expires_after_the_configured_ttl() {
    let app = app().await;
    assert_eq!(
        app.issue(REQUEST_KEY, &issuance_body("pi_wait", 2))
            .await
            .status(),
        202
    );
    assert_expires_in_days(&app, "pi_wait", 7).await;

    // The TTL index that removes expired pending records exists after migrations.
    let indexes: Vec<IndexModel> = app
        .db
        .collection::<Document>("issuances")
        .list_indexes()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ttl = indexes
        .iter()
        .find(|i| {
            i.options.as_ref().and_then(|o| o.name.as_deref()) == Some("issuances_pending_expiry")
        })
        .unwrap_or_else(|| panic!("no issuances_pending_expiry index in {indexes:?}"));
    let keys: Vec<(&String, Option<i64>)> = ttl
        .keys
        .iter()
        .map(|(k, v)| (k, v.as_i64().or(v.as_i32().map(i64::from))))
        .collect();
    assert_eq!(keys, [(&"expiresAt".to_owned(), Some(1))], "{ttl:?}");
    assert_eq!(
        ttl.options.as_ref().unwrap().expire_after,
        Some(Duration::ZERO),
        "{ttl:?}"
    );

    // A configured TTL is used instead of the default.
    let short = spawn_app_with(&format!("{PROVIDERS}\n[issuance]\npending_ttl_days = 2\n")).await;
    assert_eq!(
        short
            .issue(REQUEST_KEY, &issuance_body("pi_wait", 2))
            .await
            .status(),
        202
    );
    assert_expires_in_days(&short, "pi_wait", 2).await;
}

#[tokio::test]
async fn invalid_newer_metadata_voids_the_older_parameters_for_checkout() {
    let app = app().await;
    let t = now();

    // The checkout waits; the provider first names valid parameters (processing), then
    // reports success with metadata that is no longer usable.
    let asked = issuance_body("pi_void", 2);
    assert_eq!(app.issue(REQUEST_KEY, &asked).await.status(), 202);
    let processing = json(
        deliver_stripe(
            &app,
            &intent_event("evt_v1", "processing", "pi_void", t, "2"),
        )
        .await,
    )
    .await;
    assert_eq!(processing["outcome"], "recorded", "{processing}");
    let succeeded = json(
        deliver_stripe(
            &app,
            &intent_event("evt_v2", "succeeded", "pi_void", t + 10, "x"),
        )
        .await,
    )
    .await;
    assert_eq!(succeeded["outcome"], "metadata_invalid", "{succeeded}");
    let refused = assert_problem(app.issue(REQUEST_KEY, &asked).await, 409, "state_conflict").await;
    assert!(refused.get("mismatches").is_none(), "{refused}");
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let pending = record(&app, "pi_void").await.unwrap();
    assert_eq!(
        pending.get_str("status").unwrap(),
        "pending",
        "nothing issued from the old parameters"
    );
    let payment = app
        .find_stored("payments", doc! { "paymentIntentId": "pi_void" })
        .await;
    assert_eq!(payment.get_str("status").unwrap(), "succeeded");
    assert!(
        payment.get_str("metadataError").is_ok(),
        "the reason is kept: {payment}"
    );
    assert!(
        matches!(payment.get("tokenParams"), None | Some(Bson::Null)),
        "the older parameters are void: {payment}"
    );

    // The other order: the invalid success first, the older valid one delivered late.
    // The late event cannot bring the old parameters back.
    deliver_stripe(
        &app,
        &intent_event("evt_w2", "succeeded", "pi_void2", t + 10, "x"),
    )
    .await;
    let late = json(
        deliver_stripe(
            &app,
            &intent_event("evt_w1", "succeeded", "pi_void2", t, "2"),
        )
        .await,
    )
    .await;
    assert_eq!(
        late.get("tokensCreated")
            .and_then(|n| n.as_u64())
            .unwrap_or(0),
        0,
        "{late}"
    );
    assert_problem(
        app.issue(REQUEST_KEY, &issuance_body("pi_void2", 2)).await,
        409,
        "state_conflict",
    )
    .await;
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    assert_eq!(
        app.count("issuances", doc! { "paymentIntentId": "pi_void2" })
            .await,
        0
    );

    // Only a trusted backend can issue for such a payment.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_void2", 2))
            .await
            .status(),
        201
    );
    assert_eq!(app.token_indexes("pi_void2").await, vec![0, 1]);
}

#[tokio::test]
async fn checkout_keys_never_see_the_recorded_values_of_a_conflict() {
    let app = app().await;

    // Issued by a trusted backend; a different request from each kind of key.
    assert_eq!(
        app.issue(WRITER_KEY, &issuance_body("pi_mine", 2))
            .await
            .status(),
        201
    );
    let mut other = issuance_body("pi_mine", 3);
    other["owner"] = json!(OTHER_OWNER);
    let trusted = assert_problem(
        app.issue(WRITER_KEY, &other).await,
        409,
        "idempotency_conflict",
    )
    .await;
    let mismatches = trusted["mismatches"].as_array().unwrap();
    assert_eq!(mismatches.len(), 2, "{trusted}");
    assert_eq!(mismatches[0]["field"], "owner");
    assert_eq!(mismatches[0]["existing"], OWNER, "{trusted}");
    assert_eq!(mismatches[0]["requested"], OTHER_OWNER);
    assert_eq!(mismatches[1]["field"], "quantity");
    assert_eq!(mismatches[1]["existing"], 2, "{trusted}");
    assert_eq!(mismatches[1]["requested"], 3);

    let checkout = assert_hidden_conflict(app.issue(REQUEST_KEY, &other).await).await;
    assert!(
        !checkout.to_string().contains(OWNER),
        "the recorded owner leaks: {checkout}"
    );

    // Against another checkout's pending request: it decides nothing, so the second
    // waits as well, answered with its own parameters, never the first's.
    assert_eq!(
        app.issue(REQUEST_KEY, &issuance_body("pi_pending", 1))
            .await
            .status(),
        202
    );
    let mut rival = issuance_body("pi_pending", 1);
    rival["owner"] = json!(OTHER_OWNER);
    let waiting = app.issue(REQUEST_KEY, &rival).await;
    assert_eq!(waiting.status(), 202);
    let waiting = json(waiting).await;
    assert_eq!(waiting["issuance"]["owner"], OTHER_OWNER, "{waiting}");
    assert!(
        !waiting.to_string().contains(OWNER),
        "the first request leaks: {waiting}"
    );
    // Answered again alike, naming the payment's one pending record.
    let again = json(app.issue(REQUEST_KEY, &rival).await).await;
    assert_eq!(again, waiting);
    // A right guess of the first request's parameters is answered as a wrong one: with
    // the request's own fields (here its mode), nothing of the first request's.
    let mut guess = issuance_body("pi_pending", 1);
    guess["mode"] = json!("atomic");
    let guessed = json(app.issue(REQUEST_KEY, &guess).await).await;
    assert_eq!(guessed["issuance"]["mode"], "atomic", "{guessed}");
    let pending = record(&app, "pi_pending").await.unwrap();
    assert_eq!(
        waiting["issuance"]["id"],
        pending.get_object_id("_id").unwrap().to_hex()
    );
    assert_eq!(
        pending.get_object_id("owner").unwrap(),
        ObjectId::parse_str(OWNER).unwrap(),
        "the first request's record is left as it is"
    );

    // Against the provider's metadata.

    deliver_stripe(
        &app,
        &intent_event("evt_meta", "succeeded", "pi_paid", now(), "2"),
    )
    .await;
    assert_hidden_conflict(app.issue(REQUEST_KEY, &issuance_body("pi_paid", 5)).await).await;
    let trusted = assert_problem(
        app.issue(WRITER_KEY, &issuance_body("pi_paid", 5)).await,
        409,
        "idempotency_conflict",
    )
    .await;
    assert_eq!(trusted["mismatches"][0]["existing"], 2, "{trusted}");

    // None of the refused requests wrote anything.
    assert_eq!(app.token_indexes("pi_mine").await, vec![0, 1]);
    assert_eq!(app.token_indexes("pi_paid").await, vec![0, 1]);
    assert_eq!(app.token_indexes("pi_pending").await, Vec::<i64>::new());
    assert_eq!(app.count("issuances", doc! {}).await, 3);
    let mine = record(&app, "pi_mine").await.unwrap();
    assert_eq!(mine.get_i64("quantity").unwrap(), 2);
}

/// A trusted backend's issuance outranks a checkout's pending request for the same
/// payment: the pending record is taken over with the backend's parameters and its set
/// written, in either mode (atomic mode meets the pending record as the duplicate key
/// that ends its transaction).
#[tokio::test]
async fn a_trusted_issuance_takes_over_a_pending_checkout_request_in_either_mode() {
    let app = app().await;
    for mode in ["upsert", "atomic"] {
        let payment = format!("pi_taken_{mode}");
        let asked = app.issue(REQUEST_KEY, &issuance_body(&payment, 1)).await;
        assert_eq!(
            asked.status(),
            202,
            "{mode}: {}",
            asked.text().await.unwrap()
        );

        let mut trusted = issuance_body(&payment, 3);
        trusted["mode"] = json!(mode);
        let issued = app.issue(WRITER_KEY, &trusted).await;
        assert_eq!(issued.status(), 201, "{mode}");

        let record = record(&app, &payment).await.expect("the record");
        assert_eq!(record.get_str("status").unwrap(), "issued", "{mode}");
        assert_eq!(record.get_i64("quantity").unwrap(), 3, "{mode}");
        assert_eq!(record.get_str("mode").unwrap(), mode);
        assert_eq!(app.token_indexes(&payment).await, vec![0, 1, 2], "{mode}");
        assert_eq!(
            app.count("issuances", doc! { "paymentIntentId": &payment })
                .await,
            1
        );
    }
}

/// Whoever asks first holds nothing: a checkout that meets another's pending request for
/// the same payment waits as well (with `Prefer: wait`, for the provider's success), and
/// the success decides whose parameters are issued — here the second's.
#[tokio::test]
async fn a_checkout_after_anothers_pending_request_waits_and_the_success_decides() {
    let app = app().await;
    let mut squatter = issuance_body("pi_squat", 1);
    squatter["owner"] = json!(OTHER_OWNER);
    assert_eq!(app.issue(REQUEST_KEY, &squatter).await.status(), 202);

    let shopper = issuance_body("pi_squat", 2);
    let waiting = {
        let (app, shopper) = (&app, &shopper);
        async move {
            app.http
                .post(app.url("/v1/issuances"))
                .bearer_auth(REQUEST_KEY)
                .header("prefer", "wait=10")
                .json(shopper)
                .send()
                .await
                .unwrap()
        }
    };
    let paying = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let success = intent_event("evt_squat", "succeeded", "pi_squat", now(), "2");
        assert_eq!(deliver_stripe(&app, &success).await.status(), 200);
    };
    let (answer, ()) = tokio::join!(waiting, paying);
    assert_eq!(
        answer.status(),
        200,
        "fulfilled by the success (waiting for it, or after it on a slow machine)"
    );
    let answer = json(answer).await;
    assert_eq!(answer["tokens"].as_array().unwrap().len(), 2, "{answer}");
    assert_eq!(app.token_indexes("pi_squat").await, vec![0, 1]);
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pi_squat", "owner": ObjectId::parse_str(OWNER).unwrap() }).await,
        2,
        "the shopper's, as the success named"
    );
    // The first request now meets an issuance with other parameters: refused, told nothing.
    assert_hidden_conflict(app.issue(REQUEST_KEY, &squatter).await).await;
}

/// A checkout's request answered from a trusted backend's issuance is answered the same
/// once the provider's success arrives, whatever that success names (no parameters, or
/// another owner's): the record is what was issued, nothing more is written.
#[tokio::test]
async fn a_checkout_answered_from_a_backends_issuance_is_answered_the_same_after_the_success() {
    let app = app().await;
    let other_owner = json!({
        "tokenmint_owner": OTHER_OWNER, "tokenmint_token_type": "standard", "tokenmint_quantity": "2",
    });
    for (payment, metadata) in [
        ("pi_backend_bare", json!({})),
        ("pi_backend_other", other_owner),
    ] {
        let body = issuance_body(payment, 2);
        assert_eq!(app.issue(REQUEST_KEY, &body).await.status(), 202);
        assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
        let before = app.issue(REQUEST_KEY, &body).await;
        assert_eq!(before.status(), 200, "{payment}");
        let before = json(before).await;

        let mut success = intent_event(&format!("evt_{payment}"), "succeeded", payment, now(), "2");
        success["data"]["object"]["metadata"] = metadata;
        assert_eq!(deliver_stripe(&app, &success).await.status(), 200);

        let after = app.issue(REQUEST_KEY, &body).await;
        assert_eq!(after.status(), 200, "{payment}");
        assert_eq!(json(after).await["tokens"], before["tokens"], "{payment}");
        let record = record(&app, payment).await.expect("the record");
        assert_eq!(record.get_str("status").unwrap(), "issued", "{record}");
        assert_eq!(record.get_i64("quantity").unwrap(), 2);
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": payment })
                .await,
            2
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": payment, "owner": ObjectId::parse_str(OWNER).unwrap() }).await,
            2,
            "{payment}: the backend's owner holds them"
        );
    }
}

/// The dates of `payment`'s record and of each of its tokens' `origin.date`.
async fn recorded_dates(app: &TestApp, payment: &str) -> (Document, Vec<mongodb::bson::DateTime>) {
    let record = record(app, payment).await.expect("the record");
    let tokens: Vec<Document> = app
        .db
        .collection::<Document>("tokens")
        .find(doc! { "origin.paymentIntentId": payment })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let dates = tokens
        .iter()
        .map(|t| {
            *t.get_document("origin")
                .unwrap()
                .get_datetime("date")
                .unwrap()
        })
        .collect();
    (record, dates)
}

/// The take-over of a pending record keeps nothing the anonymous checkout wrote: a
/// trusted backend's issuance, or the provider's signed success, becomes the record's
/// author (`requestedBy`) and its `paymentDate`, and so every token's `origin.date`.
#[tokio::test]
async fn a_take_over_records_the_authorising_request_not_the_checkouts() {
    let app = app().await;
    let forged = mongodb::bson::DateTime::parse_rfc3339_str("1999-01-01T00:00:00Z").unwrap();
    let ask = |payment: &str| {
        let mut body = issuance_body(payment, 1);
        body["paymentDate"] = json!("1999-01-01T00:00:00Z");
        body
    };

    // Taken over by the trusted backend, with its own date.
    let asked = app.issue(REQUEST_KEY, &ask("pi_dated_trusted")).await;
    assert_eq!(asked.status(), 202);
    let pending = record(&app, "pi_dated_trusted").await.unwrap();
    assert_eq!(pending.get_str("requestedBy").unwrap(), "key:checkout");
    let mut trusted = issuance_body("pi_dated_trusted", 2);
    trusted["paymentDate"] = json!("2026-11-30T10:00:00Z");
    assert_eq!(app.issue(WRITER_KEY, &trusted).await.status(), 201);
    let (record, dates) = recorded_dates(&app, "pi_dated_trusted").await;
    let trusted_date = mongodb::bson::DateTime::parse_rfc3339_str("2026-11-30T10:00:00Z").unwrap();
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(record.get_str("requestedBy").unwrap(), "key:writer");
    assert_eq!(*record.get_datetime("paymentDate").unwrap(), trusted_date);
    assert!(record.get("expiresAt").is_none(), "{record}");
    assert_eq!(
        record.get_object_id("_id").unwrap(),
        pending.get_object_id("_id").unwrap()
    );
    assert_eq!(dates, vec![trusted_date; 2]);

    // Taken over by the provider's signed success: the provider's date.
    let asked = app.issue(REQUEST_KEY, &ask("pi_dated_provider")).await;
    assert_eq!(asked.status(), 202);
    let event = intent_event("evt_dated", "succeeded", "pi_dated_provider", now(), "3");
    let delivered = deliver_stripe(&app, &event).await;
    assert_eq!(delivered.status(), 200);
    assert_eq!(json(delivered).await["outcome"], "issued");
    let (record, dates) = recorded_dates(&app, "pi_dated_provider").await;
    assert_eq!(record.get_str("requestedBy").unwrap(), "provider:stripe");
    let date = *record.get_datetime("paymentDate").unwrap();
    assert_ne!(date, forged);
    let age = Utc::now().timestamp_millis() - date.timestamp_millis();
    assert!(
        (0..86_400_000).contains(&age),
        "paymentDate {date} is not the event's"
    );
    assert_eq!(dates, vec![date; 3]);
}

/// The provider reported the payment paid, and its own issuance failed (the provider
/// will deliver it again later); a checkout request for the same tokens then issues them
/// — from the provider's facts: its author and date are the provider's, not the
/// anonymous caller's.
#[tokio::test]
async fn a_checkout_request_after_the_providers_success_records_the_providers_facts() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, &format!("{PROVIDERS}[repair]\nenabled = false\n")).await;
    let event = intent_event("evt_paid_first", "succeeded", "pi_paid_first", now(), "2");
    let failpoint = FailPoint::always(&name, &["insert"], Fault::error(91)).await;
    let delivered = deliver_stripe(&app, &event).await;
    assert!(
        delivered.status().is_server_error(),
        "{}",
        delivered.status()
    );
    failpoint.off().await;
    assert_eq!(payment_status(&app, "pi_paid_first").await.0, "succeeded");
    assert_eq!(app.count_records(doc! {}).await, 0, "nothing issued yet");

    let mut asked = issuance_body("pi_paid_first", 2);
    asked["paymentDate"] = json!("1999-01-01T00:00:00Z");
    let answer = app.issue(REQUEST_KEY, &asked).await;
    assert_eq!(answer.status(), 201);
    let (record, dates) = recorded_dates(&app, "pi_paid_first").await;
    assert_eq!(record.get_str("requestedBy").unwrap(), "provider:stripe");
    let forged = mongodb::bson::DateTime::parse_rfc3339_str("1999-01-01T00:00:00Z").unwrap();
    let date = *record.get_datetime("paymentDate").unwrap();
    assert_ne!(date, forged);
    assert_eq!(dates, vec![date; 2]);
}
