//! Self-repair: an `issuing` record left short (its writer died between the record and
//! the end of its tokens) is completed, settled and marked `issued` by the service on
//! its own, with no client request. Each test writes the crash's leftovers straight into
//! the app's database, shaped exactly as the service writes them (the builders here), then
//! only watches: [`completion`] for the sweep itself, [`withdrawn`] for leftovers of a
//! payment refunded meanwhile.

mod completion;
mod withdrawn;

use std::time::{Duration, Instant};

use mongodb::Database;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};

use crate::helpers::*;

/// Sweeps every 200 ms; records older than 500 ms count as abandoned.
const FAST_REPAIR: &str = "[repair]\ninterval_ms = 200\nmin_age_ms = 500\n";
/// How long a test waits for the service to repair what it seeded.
const REPAIR_WITHIN: Duration = Duration::from_secs(30);
/// A payment date in the past, unlike anything a repair could invent from its own clock.
const PAYMENT_DATE_MS: i64 = 1_700_000_000_000;
/// Not `standard` (what the helpers' bodies use): the repair must take the recorded type.
const TOKEN_TYPE: &str = "gold";

/// What a crash left of one payment's issuance.
struct Seeded {
    payment: String,
    owner: ObjectId,
    quantity: i64,
    /// The tokens written before the crash, exactly as stored.
    tokens: Vec<Document>,
}

/// Time `ago` before now, at BSON precision.
fn ago(age: Duration) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - age.as_millis() as i64)
}

/// The record the service writes before any token (`IssuanceDoc`, status `issuing`).
fn issuing_record(payment: &str, owner: ObjectId, quantity: i64, created_at: DateTime) -> Document {
    doc! {
        "_id": ObjectId::new(),
        "provider": "stripe",
        "accountId": "acct_1",
        "paymentIntentId": payment,
        "owner": owner,
        "tokenType": TOKEN_TYPE,
        "quantity": quantity,
        "paymentDate": DateTime::from_millis(PAYMENT_DATE_MS),
        "mode": "upsert",
        "status": "issuing",
        "createdAt": created_at,
    }
}

/// A token as the service first writes it (`new_token`), with its `_id`.
fn token(payment: &str, owner: ObjectId, index: i64, written_at: DateTime) -> Document {
    doc! {
        "_id": ObjectId::new(),
        "owner": owner,
        "type": TOKEN_TYPE,
        "tokenIndex": index,
        "origin": {
            "provider": "stripe",
            "accountId": "acct_1",
            "paymentIntentId": payment,
            "date": DateTime::from_millis(PAYMENT_DATE_MS),
        },
        "status": "active",
        "_version": 0_i32,
        "createdAt": written_at,
        "updatedAt": written_at,
    }
}

/// Writes what a crash leaves: the tokens `present` of `payment`, then its `record`
/// (tokens first, so a sweep never sees the record before its tokens).
async fn seed(db: &Database, record: Document, present: impl IntoIterator<Item = i64>) -> Seeded {
    let payment = record.get_str("paymentIntentId").unwrap().to_owned();
    let owner = record.get_object_id("owner").unwrap();
    let quantity = record.get_i64("quantity").unwrap();
    let written_at = record.get_datetime("createdAt").copied().unwrap();
    let tokens: Vec<Document> = present
        .into_iter()
        .map(|index| token(&payment, owner, index, written_at))
        .collect();
    if !tokens.is_empty() {
        db.collection::<Document>("tokens")
            .insert_many(&tokens)
            .await
            .unwrap();
    }
    db.collection::<Document>("issuances")
        .insert_one(record)
        .await
        .unwrap();
    Seeded {
        payment,
        owner,
        quantity,
        tokens,
    }
}

/// The issuance record of `payment`, which must exist.
async fn record_of(db: &Database, payment: &str) -> Document {
    db.collection::<Document>("issuances")
        .find_one(doc! { "paymentIntentId": payment })
        .await
        .unwrap()
        .expect("the seeded record")
}

/// Polls until no record of the database is `issuing` any more, for at most `within`.
async fn wait_until_none_issuing(db: &Database, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let issuing = db
            .collection::<Document>("issuances")
            .count_documents(doc! { "status": "issuing" })
            .await
            .unwrap();
        if issuing == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{issuing} record(s) still issuing after {within:?}: the service did not repair them"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts `seeded`'s payment holds exactly tokenIndex 0..quantity-1 with the recorded
/// owner, type and date, that the tokens written before the crash are untouched (same
/// `_id`, same document), and that its record is `issued` with no lease left. Returns the
/// stored tokens.
async fn assert_completed(db: &Database, seeded: &Seeded) -> Vec<Document> {
    let payment = &seeded.payment;
    let record = record_of(db, payment).await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    assert!(!record.contains_key("repairLeaseUntil"), "{record}");
    let stored = payment_tokens(db, payment).await;
    let indexes: Vec<i64> = stored
        .iter()
        .map(|t| t.get_i64("tokenIndex").unwrap())
        .collect();
    assert_eq!(
        indexes,
        (0..seeded.quantity).collect::<Vec<_>>(),
        "{payment}: tokens"
    );
    for token in &stored {
        assert_eq!(token.get_object_id("owner"), Ok(seeded.owner), "{token}");
        assert_eq!(token.get_str("type"), Ok(TOKEN_TYPE), "{token}");
        assert_eq!(
            token.get_document("origin").unwrap().get_datetime("date"),
            Ok(&DateTime::from_millis(PAYMENT_DATE_MS)),
            "{token}"
        );
    }
    for before in &seeded.tokens {
        let index = before.get_i64("tokenIndex").unwrap();
        assert_eq!(
            &stored[index as usize], before,
            "{payment}: token {index} was rewritten by the repair"
        );
    }
    stored
}

/// `tokenmint_repairs_total{outcome}` as `/metrics` shows it (0 before the first one).
/// The recorder is process-wide: other tests' repairs count too, so tests compare
/// before and after.
async fn repairs(app: &TestApp, outcome: &str) -> f64 {
    let series = format!("tokenmint_repairs_total{{outcome=\"{outcome}\"}}");
    metric_value(&app.metrics().await, &series).unwrap_or(0.0)
}
