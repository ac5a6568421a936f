//! An upsert batch inserts its records while its read of the payments is still on the way
//! (`unconfirmed`). What it must never do: leave a record, or a token, for a payment the
//! read shows not to stand; free a place a refund held meanwhile; or let a retry that
//! meets the record while the read is held up answer other tokens than the first request.
//! The read is held up (or failed) by a failpoint on the app's `find`: the batch's read of
//! the payments is the first one the app sends; the take-back, by one on its `delete`.

use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};
use tokenmint::domain::IssuanceStatus;
use tokenmint::store::{Existing, IssuanceDoc};

use super::NO_SWEEPS;
use crate::helpers::*;
use crate::provider_events::*;

/// How long the batch's read of the payments is held up.
const READ_HELD_FOR: Duration = Duration::from_millis(1500);

/// Holds up the next `find` of the app named `name` for `READ_HELD_FOR`: the read of the
/// payments of the next batch.
async fn hold_up_the_read(name: &str) -> FailPoint {
    let millis = READ_HELD_FOR.as_millis() as i64;
    FailPoint::set(name, &["find"], Fault::Block { millis }, 1).await
}

/// A faulty app that knows the Stripe provider, without sweeps.
async fn faulty_app(name: &str) -> TestApp {
    spawn_app_named(name, &format!("{PROVIDERS}{NO_SWEEPS}")).await
}

/// What `issuances` holds for `payment`, records and placeholders alike.
async fn places(app: &TestApp, payment: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    app.db
        .collection::<Document>("issuances")
        .find(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Waits until the batch held up on its read has inserted `payment`'s record, and the
/// insert (which the primary alone acknowledged) is majority-committed: what the
/// service's own reads see.
async fn unconfirmed_record_inserted(app: &TestApp, payment: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let majority = app.db.collection_with_options::<Document>(
        "issuances",
        mongodb::options::CollectionOptions::builder()
            .read_concern(mongodb::options::ReadConcern::majority())
            .build(),
    );
    while majority
        .count_documents(doc! { "paymentIntentId": payment, "unconfirmed": true })
        .await
        .unwrap()
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the batch never inserted its unconfirmed record"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A payment refunded more than a placeholder's lifetime ago: its placeholder is gone, so
/// nothing but the batch's read tells the record insert that the payment does not stand.
async fn refunded_long_ago(app: &TestApp, payment: &str) {
    let refund = refund_event(&format!("evt_{payment}_r"), payment, now());
    assert_eq!(deliver_stripe(app, &refund).await.status(), 200);
    let removed = app
        .db
        .collection::<Document>("issuances")
        .delete_many(doc! { "paymentIntentId": payment, "status": "placeholder" })
        .await
        .unwrap();
    assert_eq!(removed.deleted_count, 1, "the refund left a placeholder");
}

/// Asserts that `payment`'s record is still unconfirmed and that no token was written for
/// it (none may be before the payment is read as standing); returns the record.
async fn assert_left_unconfirmed(app: &TestApp, payment: &str) -> Document {
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_bool("unconfirmed"), Ok(true), "{record}");
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": payment })
            .await,
        0,
        "a token written for a record no one confirmed"
    );
    record
}

/// Inserts `request`'s record as a batch does before its read answers: `issuing`,
/// `unconfirmed`.
async fn insert_unconfirmed(
    store: &tokenmint::store::Store,
    request: &tokenmint::domain::NewIssuance,
) -> IssuanceDoc {
    let record = IssuanceDoc {
        unconfirmed: true,
        ..IssuanceDoc::new(request, IssuanceStatus::Issuing)
    };
    store
        .insert_records(std::slice::from_ref(&record))
        .await
        .unwrap();
    record
}

/// Sends `body` as the writer key and asserts the refusal: 409 `payment_not_succeeded`.
async fn assert_refused(app: &TestApp, body: &serde_json::Value) {
    assert_problem(
        app.issue(WRITER_KEY, body).await,
        409,
        "payment_not_succeeded",
    )
    .await;
}

#[tokio::test]
async fn a_payment_refunded_long_ago_is_refused_and_its_record_taken_back() {
    let app = faulty_app(&unique_app_name()).await;
    let payment = "pi_unc_refunded";
    refunded_long_ago(&app, payment).await;

    for _ in 0..2 {
        assert_refused(&app, &issuance_body(payment, 4)).await;
        assert_eq!(
            places(&app, payment).await,
            Vec::<Document>::new(),
            "the refused request left something in issuances"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": payment })
                .await,
            0
        );
    }
}

#[tokio::test]
async fn a_refund_holding_the_place_while_the_read_is_held_up_keeps_it_held() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_held";
    let held_up = hold_up_the_read(&name).await;

    let body = issuance_body(payment, 4);
    let (first, ()) = tokio::join!(app.issue(WRITER_KEY, &body), async {
        unconfirmed_record_inserted(&app, payment).await;
        // The refund is recorded, then holds the payment's place: it finds the batch's
        // record and marks it held. The batch's read, run after this, shows the refund.
        let refund = refund_event("evt_unc_held_r", payment, now());
        assert_eq!(deliver_stripe(&app, &refund).await.status(), 200);
    });
    assert_eq!(held_up.off().await, 1, "the read was not held up");
    assert_problem(first, 409, "payment_not_succeeded").await;

    let places = places(&app, payment).await;
    assert_eq!(places.len(), 1, "{places:?}");
    let place = &places[0];
    assert_eq!(
        place.get_str("status"),
        Ok("placeholder"),
        "the held place is still taken, by a placeholder: {place}"
    );
    assert!(place.get_datetime("expiresAt").is_ok(), "{place}");
    for gone in ["unconfirmed", "quantity", "owner"] {
        assert!(!place.contains_key(gone), "{place}");
    }
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": payment })
            .await,
        0
    );
    // Sent again: refused, and the placeholder is what stays.
    assert_refused(&app, &body).await;
    assert_eq!(
        app.count_records(doc! { "paymentIntentId": payment }).await,
        0
    );
}

#[tokio::test]
async fn a_retry_meeting_the_record_while_the_read_is_held_up_answers_the_same_tokens() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_retry";
    let held_up = hold_up_the_read(&name).await;

    let body = issuance_body(payment, 4);
    let (first, retry) = tokio::join!(app.issue(WRITER_KEY, &body), async {
        unconfirmed_record_inserted(&app, payment).await;
        // The retry's own batch finds the record; the one-request path confirms it and
        // writes the set while the first batch still waits for its read.
        app.issue(WRITER_KEY, &body).await
    });
    assert_eq!(held_up.off().await, 1, "the read was not held up");
    assert_eq!(retry.status(), 200, "the retry replays the record");
    assert_eq!(first.status(), 201);
    let retry: serde_json::Value = retry.json().await.unwrap();
    let first: serde_json::Value = first.json().await.unwrap();

    let stored = app.stored_token_ids(payment).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    for answer in [&first, &retry] {
        let named: Vec<String> = indexed_token_ids(answer)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert_eq!(named, stored, "an answer named other tokens: {answer}");
    }
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    assert!(!record.contains_key("unconfirmed"), "{record}");
}

#[tokio::test]
async fn a_failed_read_leaves_the_record_unconfirmed_and_the_retry_finishes_it() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_read_fails";
    // The read and the driver's one retry of it.
    let failing = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
    let body = issuance_body(payment, 4);
    let first = app.issue(WRITER_KEY, &body).await;
    assert_eq!(failing.off().await, 2);
    assert_problem(first, 503, "database_unavailable").await;

    let record = assert_left_unconfirmed(&app, payment).await;
    assert_eq!(record.get_str("status"), Ok("issuing"), "{record}");

    let again = app.issue(WRITER_KEY, &body).await;
    assert_eq!(again.status(), 200);
    let again: serde_json::Value = again.json().await.unwrap();
    let stored = app.stored_token_ids(payment).await;
    assert_eq!(stored.len(), 4);
    let named: Vec<String> = indexed_token_ids(&again)
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(named, stored);
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    assert!(!record.contains_key("unconfirmed"), "{record}");
}

/// A payment that failed more than a placeholder's lifetime ago (metadata: 3 tokens).
async fn failed_long_ago(app: &TestApp, payment: &str) {
    let failed = intent_event(
        &format!("evt_{payment}_f"),
        "payment_failed",
        payment,
        now() - 10,
        "3",
    );
    assert_eq!(deliver_stripe(app, &failed).await.status(), 200);
    app.db
        .collection::<Document>("issuances")
        .delete_many(doc! { "paymentIntentId": payment, "status": "placeholder" })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_success_arriving_while_a_refused_record_is_taken_back_issues_by_its_own_metadata() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_success_meanwhile";
    failed_long_ago(&app, payment).await;
    let turn = FailPointTurn::take().await;
    let held_up = turn
        .set(&name, &["delete"], Fault::Block { millis: 400 }, 1)
        .await;

    // A trusted request of 4 while the payment is known failed: refused, its record taken
    // back. While the take-back is held up, the customer's card goes through: the
    // success event, whose metadata says 3, finds the record and waits for its batch.
    let body = issuance_body(payment, 4);
    let (refused, ()) = tokio::join!(app.issue(WRITER_KEY, &body), async {
        assert!(
            held_up.fired_within(1, Duration::from_secs(10)).await,
            "the take-back never came"
        );
        let success = intent_event("evt_unc_success", "succeeded", payment, now(), "3");
        assert_eq!(deliver_stripe(&app, &success).await.status(), 200);
    });
    assert_eq!(held_up.off().await, 1);
    assert_problem(refused, 409, "payment_not_succeeded").await;
    assert_eq!(recorded_outcome(&app, "evt_unc_success").await, "issued");
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_i64("quantity"), Ok(3), "{record}");
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    assert_eq!(app.stored_token_ids(payment).await.len(), 3);
}

#[tokio::test]
async fn a_take_back_that_fails_answers_503_and_the_record_is_settled_later() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_take_back_fails";
    refunded_long_ago(&app, payment).await;
    let failing = FailPoint::set(&name, &["delete"], Fault::error(91), 1).await;
    let first = app.issue(WRITER_KEY, &issuance_body(payment, 4)).await;
    assert_eq!(failing.off().await, 1);
    // Not a refusal: the record is still there, for whoever finishes it.
    assert_problem(first, 503, "database_unavailable").await;
    assert_left_unconfirmed(&app, payment).await;

    // Its retry finishes it against a fresh read: the payment is refunded, so whatever
    // was written is revoked, and the answer is the refusal.
    assert_refused(&app, &issuance_body(payment, 4)).await;
    let active = app.active_indexes(payment).await;
    assert_eq!(
        active,
        Vec::<i64>::new(),
        "an active token of a refunded payment"
    );
}

#[tokio::test]
async fn a_failed_read_answers_replays_503_too() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_replay_refunded";
    let body = issuance_body(payment, 4);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 201);
    let refund = refund_event("evt_unc_replay_r", payment, now());
    assert_eq!(deliver_stripe(&app, &refund).await.status(), 200);

    // The replay's batch cannot read the payment: it is not answered from the set the
    // refund revoked.
    let failing = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
    let replay = app.issue(WRITER_KEY, &body).await;
    assert_eq!(failing.off().await, 2);
    assert_problem(replay, 503, "database_unavailable").await;
    assert_refused(&app, &body).await;
}

#[tokio::test]
async fn a_record_taken_back_whose_place_is_taken_over_is_never_confirmed() {
    let app = spawn_app().await;
    let store = app.store().await;
    let request = atomic_issuance("pi_unc_reused_id", 2);
    let record = insert_unconfirmed(&store, &request).await;
    // A refund holds the place, the batch's read refuses: the record becomes the
    // refund's placeholder, under the same `_id`.
    store.hold_place(&request.key).await.unwrap();
    assert_eq!(store.take_back_unconfirmed(&[record.id]).await.unwrap(), 1);

    let mut later = atomic_issuance("pi_unc_reused_id", 5);
    later.params.owner =
        tokenmint::domain::Owner::from_object_id(mongodb::bson::oid::ObjectId::new());
    for status in [IssuanceStatus::Pending, IssuanceStatus::Issuing] {
        let taker = IssuanceDoc::new(&later, status);
        let Some(Existing::Placeholder(id)) = store.claim_record(&taker).await.unwrap() else {
            panic!("the place is not a placeholder");
        };
        assert_eq!(id, record.id, "the placeholder keeps the record's _id");
        let taken = store
            .take_over_placeholder(id, &taker)
            .await
            .unwrap()
            .unwrap();
        // The old record's writer, stalled until now, confirms it: gone.
        assert!(
            store.confirm_record(&record).await.unwrap().is_none(),
            "{status:?}: confirmed another record under the same _id"
        );
        assert!(store.reread_record(&record).await.unwrap().is_none());
        // Back to a placeholder for the next round.
        app.db
            .collection::<Document>("issuances")
            .replace_one(
                doc! { "_id": taken.id },
                doc! { "provider": "stripe", "accountId": "acct_1",
                "paymentIntentId": "pi_unc_reused_id", "status": "placeholder" },
            )
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_record_left_unconfirmed_by_a_failed_batch_is_confirmed_without_waiting() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_abandoned";
    let failing = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
    let body = issuance_body(payment, 4);
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 503);
    assert_eq!(failing.off().await, 2);
    // Its batch failed a minute ago: no batch will decide the record now.
    let a_minute_ago = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() - 60_000,
    );
    app.db
        .collection::<Document>("issuances")
        .update_one(
            doc! { "paymentIntentId": payment },
            doc! { "$set": { "createdAt": a_minute_ago } },
        )
        .await
        .unwrap();

    // Every `find` the retry sends is counted (held up 0 ms): a retry that waited for a
    // decision would read the record again every 10 ms for a second.
    let counting = FailPoint::always(&name, &["find"], Fault::Block { millis: 0 }).await;
    let again = app.issue(WRITER_KEY, &body).await;
    let finds = counting.off().await;
    assert_eq!(again.status(), 200);
    assert!(finds < 20, "the retry waited on the record: {finds} finds");
    assert_eq!(app.stored_token_ids(payment).await.len(), 4);
}

#[tokio::test]
async fn a_record_whose_read_is_held_up_is_not_shown_yet() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_not_shown";
    let path = format!("/v1/issuances/stripe/acct_1/{payment}");
    let held_up = hold_up_the_read(&name).await;
    let body = issuance_body(payment, 4);
    let (first, shown) = tokio::join!(app.issue(WRITER_KEY, &body), async {
        unconfirmed_record_inserted(&app, payment).await;
        app.get(ADMIN_KEY, &path).await.status()
    });
    assert_eq!(held_up.off().await, 1);
    assert_eq!(
        shown, 404,
        "a record its batch may still take back was shown"
    );
    assert_eq!(first.status(), 201);
    assert_eq!(app.get(ADMIN_KEY, &path).await.status(), 200);
}

#[tokio::test]
async fn a_take_back_that_fails_answers_the_same_batchs_refused_replay_503_too() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_same_batch";
    refunded_long_ago(&app, payment).await;
    // Both writers held up in the record insert of another payment's batch each (a
    // transaction of the test's holds those payments' keys), so that the two copies of
    // the request queue meanwhile and go in one batch: the first claims the record, the
    // second is its replay. (A failpoint cannot hold them: setting the next one waits
    // for the commands the last one holds up.)
    let mut holders = Vec::new();
    for other in ["pi_unc_same_batch_1", "pi_unc_same_batch_2"] {
        let mut session = app.db.client().start_session().await.unwrap();
        session.start_transaction().await.unwrap();
        app.db
            .collection::<Document>("issuances")
            .insert_one(doc! {
                "provider": "stripe", "accountId": "acct_1", "paymentIntentId": other,
                "status": "placeholder",
            })
            .session(&mut session)
            .await
            .unwrap();
        holders.push(session);
    }
    let failing = FailPoint::set(&name, &["delete"], Fault::error(91), 1).await;
    let body = issuance_body(payment, 4);
    let (first_other, second_other) = (
        issuance_body("pi_unc_same_batch_1", 1),
        issuance_body("pi_unc_same_batch_2", 1),
    );
    let (_, _, (copy_1, copy_2)) = tokio::join!(
        app.issue(WRITER_KEY, &first_other),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            app.issue(WRITER_KEY, &second_other).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let copies = tokio::join!(app.issue(WRITER_KEY, &body), app.issue(WRITER_KEY, &body));
            for mut holder in holders {
                holder.abort_transaction().await.unwrap();
            }
            copies
        }
    );
    assert_eq!(failing.off().await, 1, "the take-back did not fail");
    // The record stays: neither copy may hear the refusal as the last word.
    let statuses = [copy_1.status().as_u16(), copy_2.status().as_u16()];
    assert_eq!(statuses, [503, 503]);
    assert_refused(&app, &body).await;
}

#[tokio::test]
async fn a_take_back_whose_turn_into_a_placeholder_fails_keeps_the_place_and_repair_settles_it() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_turn_fails";
    refunded_long_ago(&app, payment).await;
    // The batch's side, through a store named as the app: its record, held by a refund
    // meanwhile, whose read found the payment refunded.
    let store = connect_store(&mongo_uri_named(&name), &app.db_name).await;
    let mut request = atomic_issuance(payment, 4);
    request.mode = tokenmint::domain::IssuanceMode::Upsert;
    let record = insert_unconfirmed(&store, &request).await;
    store.hold_place(&request.key).await.unwrap();

    // The delete leaves the held record alone; the update that turns it into the
    // refund's placeholder fails.
    let failing = FailPoint::set(&name, &["update"], Fault::error(91), 1).await;
    assert!(store.take_back_unconfirmed(&[record.id]).await.is_err());
    assert_eq!(failing.off().await, 1);
    let place = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(place.get_bool("unconfirmed"), Ok(true), "{place}");
    assert!(
        place.get_datetime("heldAt").is_ok(),
        "the place is still held: {place}"
    );

    // Self-repair on another instance finishes it against a fresh read: the payment is
    // refunded, so whatever it writes it revokes.
    let repairer = spawn_app_on(
        &app.db_name,
        &format!("{PROVIDERS}[repair]\ninterval_ms = 200\nmin_age_ms = 500\n"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let place = repairer
            .find_stored("issuances", doc! { "paymentIntentId": payment })
            .await;
        if place.get_str("status") == Ok("issued") {
            assert!(!place.contains_key("unconfirmed"), "{place}");
            break;
        }
        assert!(Instant::now() < deadline, "never repaired: {place}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let states = repairer.token_states(payment).await;
    assert_eq!(states.len(), 4, "{states:?}");
    assert!(
        states.iter().all(|(_, status)| status == "revoked"),
        "an active token of a refunded payment: {states:?}"
    );
}

#[tokio::test]
async fn a_confirm_that_fails_writes_no_token_and_the_retry_finishes_the_record() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_confirm_fails";
    let body = issuance_body(payment, 4);
    // A batch whose read failed leaves its record unconfirmed.
    let failing_read = FailPoint::set(&name, &["find"], Fault::error(91), 2).await;
    assert_eq!(app.issue(WRITER_KEY, &body).await.status(), 503);
    assert_eq!(failing_read.off().await, 2);

    // The retry claims the place (the first `findAndModify`), meets the record, and its
    // confirm (every `findAndModify` after that) fails: nothing written, 503.
    let failing_confirm = FailPoint::after_first(&name, &["findAndModify"], Fault::error(91)).await;
    let retry = app.issue(WRITER_KEY, &body).await;
    assert!(failing_confirm.off().await >= 1, "the confirm never failed");
    assert_problem(retry, 503, "database_unavailable").await;
    assert_left_unconfirmed(&app, payment).await;

    let again = app.issue(WRITER_KEY, &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(app.stored_token_ids(payment).await.len(), 4);
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    assert!(!record.contains_key("unconfirmed"), "{record}");
}

#[tokio::test]
async fn a_repair_meeting_a_live_batchs_unconfirmed_record_leaves_it_to_the_batch() {
    let name = unique_app_name();
    let app = faulty_app(&name).await;
    let payment = "pi_unc_repaired";
    refunded_long_ago(&app, payment).await;
    // Held up for less than a retry waits on an unconfirmed record, so the batch is live
    // (slow, not stalled) for the whole of the repair's first look at the record.
    let held_up = FailPoint::set(&name, &["find"], Fault::Block { millis: 600 }, 1).await;
    let repairer = tokenmint::startup::issuer(
        &test_settings(&app.db_name, PROVIDERS),
        connect_store(&mongo_uri(), &app.db_name).await,
    );

    let body = issuance_body(payment, 4);
    let (refused, repaired) = tokio::join!(app.issue(WRITER_KEY, &body), async {
        unconfirmed_record_inserted(&app, payment).await;
        repairer.repair_all().await.unwrap()
    });
    assert_eq!(held_up.off().await, 1, "the read was not held up");
    assert_problem(refused, 409, "payment_not_succeeded").await;
    assert_eq!(
        (repaired.records_finished, repaired.tokens_created),
        (0, 0),
        "{repaired:?}"
    );
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": payment })
            .await,
        0,
        "the repair wrote tokens for a record its batch was about to refuse"
    );
    assert_eq!(
        app.count_records(doc! { "paymentIntentId": payment }).await,
        0
    );
}
