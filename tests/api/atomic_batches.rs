//! Group commit in atomic mode: one transaction carries the records and tokens of many
//! issuances. Each issuance must still commit whole and be answered as if it had run
//! alone: a payment that already has a record leaves the shared transaction unwritten,
//! and its batch-mates commit on the next one.

use std::collections::HashMap;

use futures::future::join_all;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use serde_json::{Value, json};
use tokenmint::domain::IssuanceStatus;
use tokenmint::store::{AtomicSet, AtomicSetsInsert, IssuanceDoc, RevokedShare, Store};

use crate::helpers::*;
use crate::provider_events::app;

/// The shared transaction of `sets`, with a plan that commits their records as given.
async fn insert_in_one(store: &Store, sets: &[AtomicSet<'_>]) -> AtomicSetsInsert {
    store
        .insert_sets_atomically(sets, async { Ok(Ok(Vec::new())) })
        .await
        .unwrap()
}

fn atomic_body(payment: &str, quantity: i64) -> Value {
    let mut body = issuance_body(payment, quantity);
    body["mode"] = json!("atomic");
    body
}

#[tokio::test]
async fn a_shared_transaction_that_meets_a_record_writes_nothing_and_the_rest_commit_whole() {
    let app = spawn_app().await;
    let first = app
        .issue(WRITER_KEY, &atomic_body("pi_had_record", 2))
        .await;
    assert_eq!(first.status(), 201);
    let store = app.store().await;

    let requests = [
        atomic_issuance("pi_fresh_a", 3),
        atomic_issuance("pi_had_record", 5),
        atomic_issuance("pi_fresh_b", 1),
    ];
    let records: Vec<IssuanceDoc> = requests
        .iter()
        .map(|r| IssuanceDoc::new(r, IssuanceStatus::Issued))
        .collect();
    let sets: Vec<AtomicSet<'_>> = records.iter().zip(&requests).collect();

    // A plan that refuses, answered while the transaction wrote: nothing stays.
    let refused = store
        .insert_sets_atomically(&[sets[0], sets[2]], async {
            Ok(Err::<Vec<(ObjectId, Option<RevokedShare>)>, _>("refused"))
        })
        .await
        .unwrap();
    assert!(
        matches!(refused, AtomicSetsInsert::Refused("refused")),
        "{refused:?}"
    );
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 2);

    let outcome = insert_in_one(&store, &sets).await;
    assert!(
        matches!(outcome, AtomicSetsInsert::RecordExists),
        "{outcome:?}"
    );
    // Nothing of the batch-mates was written; the payment that had a record is untouched.
    assert_eq!(app.count("issuances", doc! {}).await, 1);
    assert_eq!(app.count("tokens", doc! {}).await, 2);
    assert_eq!(app.token_indexes("pi_had_record").await, vec![0, 1]);

    // Without it, the others commit together, each set whole and named in its answer.
    let rest = [sets[0], sets[2]];
    let AtomicSetsInsert::Committed(committed) = insert_in_one(&store, &rest).await else {
        panic!("the rest did not commit");
    };
    for ((record, issued), (committed_record, tokens)) in rest.iter().zip(&committed) {
        assert_eq!(committed_record.id, record.id);
        let payment = issued.key.payment_intent_id.as_str();
        let stored = app.tokens_of(payment).await;
        let stored_ids: Vec<ObjectId> = stored
            .iter()
            .map(|t| t.get_object_id("_id").unwrap())
            .collect();
        let answered_ids: Vec<ObjectId> = tokens.iter().map(|t| t.id).collect();
        assert_eq!(stored_ids, answered_ids, "{payment}");
        assert_eq!(
            app.token_indexes(payment).await,
            (0..record.quantity).collect::<Vec<i64>>()
        );
        let stored_record = app
            .find_stored("issuances", doc! { "paymentIntentId": payment })
            .await;
        assert_eq!(stored_record.get_str("status").unwrap(), "issued");
        assert_eq!(stored_record.get_object_id("_id").unwrap(), record.id);
    }
    assert_eq!(app.count("issuances", doc! {}).await, 3);
    assert_eq!(app.count("tokens", doc! {}).await, 2 + 3 + 1);
}

/// Fresh payments, replays of issued ones, repeated requests for one payment, the
/// take-over of a pending checkout request and payments known refunded, all at once:
/// whatever batches they share, each gets the answer it would get alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_atomic_issuances_sharing_batches_each_answer_as_if_alone() {
    let app = app().await;
    let mut issued_before: HashMap<String, Vec<String>> = HashMap::new();
    for p in 0..5 {
        let payment = format!("pi_old_{p}");
        let response = app.issue(WRITER_KEY, &atomic_body(&payment, 2)).await;
        assert_eq!(response.status(), 201);
        issued_before.insert(payment, token_ids(&response.json().await.unwrap()));
    }
    let pending = app
        .issue(REQUEST_KEY, &issuance_body("pi_pending", 1))
        .await;
    assert_eq!(pending.status(), 202);
    let now = DateTime::now();
    for p in 0..3 {
        let payment = format!("pi_refunded_{p}");
        app.store_payment(
            ("stripe", "acct_1", &payment),
            "refunded",
            "charge.refunded",
            now,
        )
        .await;
    }

    let mut bodies: Vec<(String, Value)> = Vec::new();
    for p in 0..30 {
        let payment = format!("pi_new_{p}");
        bodies.push((payment.clone(), atomic_body(&payment, 1 + p % 4)));
    }
    for p in 0..5 {
        let payment = format!("pi_old_{p}");
        bodies.push((payment.clone(), atomic_body(&payment, 2)));
        let payment = format!("pi_repeated_{p}");
        for _ in 0..3 {
            bodies.push((payment.clone(), atomic_body(&payment, 3)));
        }
    }
    bodies.push(("pi_pending".to_owned(), atomic_body("pi_pending", 4)));
    for p in 0..3 {
        let payment = format!("pi_refunded_{p}");
        bodies.insert(10 * p, (payment.clone(), atomic_body(&payment, 1)));
    }
    let answers = join_all(bodies.iter().map(|(payment, body)| {
        let app = &app;
        async move {
            let response = app.issue(WRITER_KEY, body).await;
            let status = response.status().as_u16();
            (
                payment.clone(),
                status,
                response.json::<Value>().await.unwrap(),
            )
        }
    }))
    .await;

    let mut created: HashMap<&str, usize> = HashMap::new();
    let mut answered: HashMap<&str, Vec<Vec<String>>> = HashMap::new();
    for (payment, status, body) in &answers {
        if payment.starts_with("pi_refunded_") {
            assert_eq!(*status, 409, "{payment}: {body}");
            assert_eq!(body["code"], "payment_not_succeeded", "{payment}");
            assert_eq!(
                app.count("issuances", doc! { "paymentIntentId": payment })
                    .await,
                0
            );
            assert_eq!(app.token_indexes(payment).await, Vec::<i64>::new());
            continue;
        }
        assert!(matches!(status, 200 | 201), "{payment}: {status} {body}");
        if *status == 201 {
            *created.entry(payment).or_default() += 1;
        }
        answered.entry(payment).or_default().push(token_ids(body));
    }
    for (payment, ids) in &answered {
        let stored = app.stored_token_ids(payment).await;
        assert!(
            ids.iter().all(|i| *i == stored),
            "{payment}: {ids:?} vs {stored:?}"
        );
        let expected_created = usize::from(!payment.starts_with("pi_old_"));
        assert_eq!(
            created.get(payment).copied().unwrap_or(0),
            expected_created,
            "{payment}"
        );
        if let Some(before) = issued_before.get(*payment) {
            assert_eq!(&stored, before, "{payment}: a replay changed nothing");
        }
        let record = app
            .find_stored("issuances", doc! { "paymentIntentId": *payment })
            .await;
        assert_eq!(record.get_str("status").unwrap(), "issued", "{payment}");
        let quantity = record.get_i64("quantity").unwrap();
        assert_eq!(
            app.token_indexes(payment).await,
            (0..quantity).collect::<Vec<i64>>(),
            "{payment}"
        );
    }
    assert_eq!(
        app.find_stored("issuances", doc! { "paymentIntentId": "pi_pending" })
            .await
            .get_i64("quantity")
            .unwrap(),
        4,
        "the trusted parameters replaced the pending request's"
    );
    let payments = 30 + 5 + 5 + 1;
    assert_eq!(app.count("issuances", doc! {}).await, payments);
    assert_eq!(
        app.count("issuances", doc! { "status": { "$ne": "issued" } })
            .await,
        0
    );
}

/// An issuance whose transaction cannot commit for a reason of its own (here a token left
/// without its record, in the way of its set) fails its own request only: the batch-mates
/// it shared a transaction with try again without it. Which requests share a batch is up
/// to timing, so the scenario runs a few times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_issuance_that_cannot_commit_fails_alone_not_its_batch_mates() {
    let app = spawn_app().await;
    for round in 0..4 {
        let blocked = format!("pi_blocked_{round}");
        app.db
            .collection::<Document>("tokens")
            .insert_one(doc! {
                "origin": { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": &blocked },
                "tokenIndex": 0_i64,
                "status": "active",
            })
            .await
            .unwrap();
        let mut payments: Vec<String> = (0..24).map(|p| format!("pi_mate_{round}_{p}")).collect();
        payments.insert(12, blocked.clone());
        let answers = join_all(payments.iter().map(|payment| {
            let app = &app;
            async move {
                let response = app.issue(WRITER_KEY, &atomic_body(payment, 2)).await;
                (payment.as_str(), response.status().as_u16())
            }
        }))
        .await;

        for (payment, status) in answers {
            if payment == blocked {
                assert_eq!(status, 500, "{payment}");
                assert_eq!(
                    app.count("issuances", doc! { "paymentIntentId": payment })
                        .await,
                    0,
                    "nothing of the failed issuance was written"
                );
                assert_eq!(app.token_indexes(payment).await, vec![0]);
            } else {
                assert_eq!(status, 201, "{payment}");
                assert_eq!(app.token_indexes(payment).await, vec![0, 1], "{payment}");
            }
        }
    }
    assert_eq!(app.count("issuances", doc! {}).await, 4 * 24);
}

/// An atomic issuance whose commit applied but whose majority did not confirm it in time
/// (a write concern error, as a URI's `wtimeoutMS` makes of a lagging majority): 503
/// `database_unavailable`, not a 500, since the retry is the cure; the retry answers the
/// committed tokens as a replay, and none is written twice.
#[tokio::test]
async fn a_commit_the_majority_did_not_confirm_in_time_answers_503_and_the_retry_replays_it() {
    let name = unique_app_name();
    let app = spawn_app_named(&name, "").await;
    let body = atomic_body("pi_unconfirmed_commit", 3);
    let failpoint = FailPoint::always(
        &name,
        &["commitTransaction"],
        Fault::WriteConcernError { code: 64 },
    )
    .await;
    let failed = app.issue(WRITER_KEY, &body).await;
    assert!(failpoint.off().await >= 1, "the commit failed");
    assert!(failed.headers().contains_key("retry-after"));
    assert_problem(failed, 503, "database_unavailable").await;
    assert_eq!(
        app.token_indexes("pi_unconfirmed_commit").await,
        vec![0, 1, 2],
        "the commit applied"
    );

    let retry = app.issue(WRITER_KEY, &body).await;
    assert_eq!(retry.status(), 200, "a replay of what the commit wrote");
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry["created"], 0);
    let mut answered: Vec<String> = retry["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token["id"].as_str().unwrap().to_owned())
        .collect();
    let mut stored: Vec<String> = app
        .tokens_of("pi_unconfirmed_commit")
        .await
        .iter()
        .map(|token| token.get_object_id("_id").unwrap().to_hex())
        .collect();
    answered.sort();
    stored.sort();
    assert_eq!(answered, stored, "the tokens the commit wrote, once");
    assert_eq!(
        app.count(
            "issuances",
            doc! { "paymentIntentId": "pi_unconfirmed_commit" }
        )
        .await,
        1
    );
}
