//! A payment whose keys a transaction holds (one left open by an instance killed in the
//! middle of it, until the server aborts it at the end of its lifetime) fails alone: the
//! issuances that share its batch are answered as if it were not there.

use futures::future::join_all;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use mongodb::{Client, ClientSession};
use tokenmint::store::{IssuanceDoc, RecordInsert, StoreError};

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orphaned_transaction_fails_its_own_payment_only_atomic() {
    an_orphaned_transaction_fails_its_own_payment_only("atomic").await;
}

/// The batch's one record insert waits on the key the orphan holds; past its patience the
/// records are inserted one by one, and only the stuck one keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_orphaned_transaction_fails_its_own_payment_only_upsert() {
    an_orphaned_transaction_fails_its_own_payment_only("upsert").await;
}

async fn an_orphaned_transaction_fails_its_own_payment_only(mode: &str) {
    let name = unique_app_name();
    let app = spawn_app_named(
        &name,
        &format!("[issuance]\ndefault_mode = \"{mode}\"\n[repair]\nenabled = false\n"),
    )
    .await;
    let mut orphan = orphan_holding(&app, "pi_stuck").await;

    // Both writer tasks are busy with a batch each (their payment reads held up), so
    // that what queues meanwhile goes out as one batch. The second issuance is sent only
    // once the first one's read is held: sent together, both could form one batch.
    let busy = FailPoint::set(&name, &["find"], Fault::Block { millis: 1500 }, 2).await;
    let mut warm_up = Vec::new();
    for (i, payment) in ["pi_busy_a", "pi_busy_b"].into_iter().enumerate() {
        let (http, url) = (app.http.clone(), app.url("/v1/issuances"));
        warm_up.push(tokio::spawn(async move {
            let answer = http
                .post(url)
                .bearer_auth(WRITER_KEY)
                .json(&issuance_body(payment, 1))
                .send()
                .await
                .unwrap();
            answer.status().as_u16()
        }));
        assert!(
            busy.fired_within(i as i64 + 1, std::time::Duration::from_secs(10))
                .await,
            "writer {i} is held in its payment read"
        );
    }

    // Its retry and twenty fresh issuances arrive together, and share batches.
    let mut bodies = vec![issuance_body("pi_stuck", 2)];
    bodies.extend((0..20).map(|i| issuance_body(&format!("pi_mate_{i}"), 2)));
    let answers = join_all(bodies.iter().map(|body| async {
        let answer = app.issue(WRITER_KEY, body).await;
        (
            body["paymentIntentId"].as_str().unwrap().to_owned(),
            answer.status().as_u16(),
        )
    }))
    .await;
    for warm_up in warm_up {
        assert_eq!(warm_up.await.unwrap(), 201);
    }
    busy.off().await;
    for (payment, status) in &answers {
        if payment == "pi_stuck" {
            assert_eq!(*status, 503, "the stuck payment");
        } else {
            assert_eq!(
                *status, 201,
                "{payment} shared a batch with the stuck payment"
            );
            assert_eq!(app.token_indexes(payment).await, vec![0, 1], "{payment}");
        }
    }
    assert_eq!(
        app.count("tokens", doc! { "origin.paymentIntentId": "pi_stuck" })
            .await,
        0
    );

    // Once the orphan is gone, the retry issues.
    orphan.abort_transaction().await.unwrap();
    let retried = app.issue(WRITER_KEY, &issuance_body("pi_stuck", 2)).await;
    assert_eq!(retried.status(), 201);
    assert_eq!(app.token_indexes("pi_stuck").await, vec![0, 1]);
}

/// One command's records around a held one: the server stops the command, and alone each
/// record goes in but the held one — the first, which the stopped command had written
/// already, as its own (one record, its `_id`), not as another writer's.
#[tokio::test]
async fn a_stopped_records_insert_keeps_what_it_wrote_and_fails_only_the_held_record() {
    let app = spawn_app().await;
    let mut orphan = orphan_holding(&app, "pi_stuck").await;
    let records: Vec<IssuanceDoc> = ["pi_before", "pi_stuck", "pi_after"]
        .map(|payment| mongodb::bson::from_document(record(payment, "upsert", "issuing")).unwrap())
        .into();
    let results = app.store().await.insert_records(&records).await.unwrap();
    assert!(
        matches!(
            results.as_slice(),
            [
                RecordInsert::Inserted,
                RecordInsert::Failed(StoreError::Contended(_)),
                RecordInsert::Inserted
            ]
        ),
        "{results:?}"
    );
    for record in [&records[0], &records[2]] {
        let stored = app
            .count(
                "issuances",
                doc! { "paymentIntentId": &record.payment_intent_id },
            )
            .await;
        assert_eq!(stored, 1, "{}", record.payment_intent_id);
        assert_eq!(app.count("issuances", doc! { "_id": record.id }).await, 1);
    }
    orphan.abort_transaction().await.unwrap();
    assert_eq!(
        app.count("issuances", doc! { "paymentIntentId": "pi_stuck" })
            .await,
        0
    );
}

/// An instance began an atomic issuance of `payment` and died before committing: its
/// transaction, left open, holds the payment's record key until it is aborted.
async fn orphan_holding(app: &TestApp, payment: &str) -> ClientSession {
    let client = Client::with_uri_str(mongo_uri()).await.unwrap();
    let mut orphan = client.start_session().await.unwrap();
    orphan.start_transaction().await.unwrap();
    client
        .database(&app.db_name)
        .collection("issuances")
        .insert_one(record(payment, "atomic", "issued"))
        .session(&mut orphan)
        .await
        .unwrap();
    orphan
}

/// An issuance record of stripe/acct_1 `payment`, as stored.
fn record(payment: &str, mode: &str, status: &str) -> Document {
    doc! {
        "_id": ObjectId::new(), "provider": "stripe", "accountId": "acct_1",
        "paymentIntentId": payment, "owner": ObjectId::parse_str(OWNER).unwrap(),
        "tokenType": "standard", "quantity": 2_i64, "paymentDate": DateTime::now(),
        "mode": mode, "status": status, "createdAt": DateTime::now(),
    }
}
