//! Self-repair: an `issuing` record left short (its writer died between the record and
//! the end of its tokens) is completed, settled and marked `issued` by the service on
//! its own, with no client request. Each test writes the crash's leftovers straight into
//! the app's database, shaped exactly as the service writes them, then only watches.

use std::time::{Duration, Instant};

use mongodb::Database;
use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};

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
    let response = app.get(READER_KEY, "/metrics").await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let prefix = format!("tokenmint_repairs_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[tokio::test]
async fn a_short_set_is_completed_by_the_service_without_any_request() {
    let app = spawn_app_with(FAST_REPAIR).await;
    let completed_before = repairs(&app, "completed").await;
    // 20 of 50 tokens, written a minute ago by an instance that died.
    let record = issuing_record(
        "pi_short",
        ObjectId::new(),
        50,
        ago(Duration::from_secs(60)),
    );
    let seeded = seed(&app.db, record, 0..20).await;

    let took = wait_until_none_issuing(&app.db, REPAIR_WITHIN).await;

    let stored = assert_completed(&app.db, &seeded).await;
    for token in &stored[20..] {
        assert_eq!(token.get_str("status"), Ok("active"), "{token}");
        assert_eq!(token.get("_version"), Some(&Bson::Int32(0)), "{token}");
    }
    assert_eq!(app.count("tokens", doc! {}).await, 50);
    let completed = repairs(&app, "completed").await;
    assert!(
        completed >= completed_before + 1.0,
        "tokenmint_repairs_total{{outcome=\"completed\"}} went from {completed_before} to {completed}"
    );
    eprintln!("repaired within {took:?}");
}

#[tokio::test]
async fn a_record_younger_than_min_age_or_leased_elsewhere_is_left_alone() {
    // Sweeps every 200 ms, but only records older than 10 minutes count as abandoned.
    let app = spawn_app_with("[repair]\ninterval_ms = 200\nmin_age_ms = 600000\n").await;
    let hour_ago = ago(Duration::from_secs(3600));
    // A request still in flight: its record is fresh.
    let young = seed(
        &app.db,
        issuing_record("pi_young", ObjectId::new(), 50, DateTime::now()),
        0..20,
    )
    .await;
    // Old, but another instance leased it an instant ago and is still repairing it.
    let lease_until = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
    let mut record = issuing_record("pi_leased", ObjectId::new(), 50, hour_ago);
    record.insert("repairLeaseUntil", lease_until);
    let leased = seed(&app.db, record, 0..20).await;
    // Old and abandoned: repaired, which shows the sweeps run.
    let old = seed(
        &app.db,
        issuing_record("pi_old", ObjectId::new(), 50, hour_ago),
        0..20,
    )
    .await;

    let started = Instant::now();
    loop {
        if record_of(&app.db, &old.payment).await.get_str("status") == Ok("issued") {
            break;
        }
        assert!(
            started.elapsed() < REPAIR_WITHIN,
            "the abandoned record was not repaired within {REPAIR_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_completed(&app.db, &old).await;
    // Ten more sweeps at least.
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (seeded, lease) in [(&young, None), (&leased, Some(lease_until))] {
        let record = record_of(&app.db, &seeded.payment).await;
        assert_eq!(record.get_str("status"), Ok("issuing"), "{record}");
        assert_eq!(
            record.get_datetime("repairLeaseUntil").ok().copied(),
            lease,
            "{record}"
        );
        assert_eq!(
            payment_tokens(&app.db, &seeded.payment).await,
            seeded.tokens,
            "{}: tokens touched",
            seeded.payment
        );
    }
}

#[tokio::test]
async fn two_instances_repairing_at_once_write_each_token_once() {
    let first = spawn_app_with(FAST_REPAIR).await;
    // Declared after `first`, so dropped before it: `first` drops the shared database.
    let second = spawn_app_on(&first.db_name, FAST_REPAIR).await;
    assert_ne!(first.address, second.address);

    // 30 short sets of 40..199 tokens: none written, a prefix, or every third one; some
    // leased by a repairer that died (its lease ran out a second ago).
    let created_at = ago(Duration::from_secs(60));
    let expired_lease = ago(Duration::from_secs(1));
    let mut tokens = Vec::new();
    let mut records = Vec::new();
    let mut seeded = Vec::new();
    for i in 0..30_i64 {
        let payment = format!("pi_pair_{i}");
        let quantity = 40 + (i * 37) % 160;
        let mut record = issuing_record(&payment, ObjectId::new(), quantity, created_at);
        if i % 5 == 0 {
            record.insert("repairLeaseUntil", expired_lease);
        }
        let present: Vec<i64> = match i % 3 {
            0 => Vec::new(),
            1 => (0..i % quantity).collect(),
            _ => (0..quantity).step_by(3).collect(),
        };
        let owner = record.get_object_id("owner").unwrap();
        let written: Vec<Document> = present
            .into_iter()
            .map(|index| token(&payment, owner, index, created_at))
            .collect();
        tokens.extend(written.iter().cloned());
        seeded.push(Seeded {
            payment,
            owner,
            quantity,
            tokens: written,
        });
        records.push(record);
    }
    // Tokens first, then every record at once: both instances find the whole backlog.
    first
        .db
        .collection::<Document>("tokens")
        .insert_many(&tokens)
        .await
        .unwrap();
    first
        .db
        .collection::<Document>("issuances")
        .insert_many(&records)
        .await
        .unwrap();

    let took = wait_until_none_issuing(&first.db, Duration::from_secs(60)).await;

    let mut expected_tokens = 0;
    for seeded in &seeded {
        assert_completed(&first.db, seeded).await;
        expected_tokens += seeded.quantity as u64;
    }
    assert_eq!(first.count("tokens", doc! {}).await, expected_tokens);
    let report = first.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.issuances_checked, 30);
    assert_eq!(report.tokens_checked, expected_tokens);
    eprintln!(
        "two instances repaired 30 sets ({expected_tokens} tokens, {} seeded) within {took:?}",
        tokens.len()
    );
    drop(second);
}

#[tokio::test]
async fn a_short_set_of_a_refunded_payment_is_completed_and_revoked() {
    let app = spawn_app_with(FAST_REPAIR).await;
    let revoked_before = repairs(&app, "revoked").await;
    let created_at = ago(Duration::from_secs(60));
    // The refund was recorded while the crashed writer was between its writes, after it
    // had checked the payment: nothing revoked its tokens yet.
    app.db
        .collection::<Document>("payments")
        .insert_one(doc! {
            "provider": "stripe",
            "accountId": "acct_1",
            "paymentIntentId": "pi_refunded",
            "status": "refunded",
            "version": 2_i64,
            "lastEventId": "evt_refund",
            "lastEventType": "charge.refunded",
            "createdAt": created_at,
            "updatedAt": created_at,
        })
        .await
        .unwrap();
    let record = issuing_record("pi_refunded", ObjectId::new(), 30, created_at);
    let seeded = seed(&app.db, record, 0..10).await;

    wait_until_none_issuing(&app.db, REPAIR_WITHIN).await;

    let record = record_of(&app.db, "pi_refunded").await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");
    let stored = payment_tokens(&app.db, "pi_refunded").await;
    let indexes: Vec<i64> = stored
        .iter()
        .map(|t| t.get_i64("tokenIndex").unwrap())
        .collect();
    assert_eq!(indexes, (0..30).collect::<Vec<_>>());
    for token in &stored {
        assert_eq!(token.get_str("status"), Ok("revoked"), "{token}");
        assert_eq!(token.get_str("revocationReason"), Ok("refunded"), "{token}");
    }
    // The ten tokens written before the crash kept their ids.
    for before in &seeded.tokens {
        let index = before.get_i64("tokenIndex").unwrap() as usize;
        assert_eq!(stored[index].get("_id"), before.get("_id"));
    }
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
    let revoked = repairs(&app, "revoked").await;
    assert!(
        revoked >= revoked_before + 1.0,
        "tokenmint_repairs_total{{outcome=\"revoked\"}} went from {revoked_before} to {revoked}"
    );
}

/// An atomic issuance commits its record `issued` with every token, then re-reads the
/// payment. A process that died between the two, while a refund's own settle had already
/// run (before the commit made the tokens visible), leaves a complete, issued set of
/// active tokens that nobody else would revoke: the sweep of recent withdrawals does.
#[tokio::test]
async fn a_crashed_atomic_issuance_after_a_refund_is_revoked_by_the_sweep() {
    let app = spawn_app_with(FAST_REPAIR).await;
    let refunded_at = ago(Duration::from_secs(5));
    app.db
        .collection::<Document>("payments")
        .insert_one(doc! {
            "provider": "stripe",
            "accountId": "acct_1",
            "paymentIntentId": "pi_atomic_refunded",
            "status": "refunded",
            "version": 2_i64,
            "lastEventId": "evt_refund",
            "lastEventType": "charge.refunded",
            "createdAt": refunded_at,
            "updatedAt": refunded_at,
        })
        .await
        .unwrap();
    let mut record = issuing_record("pi_atomic_refunded", ObjectId::new(), 3, refunded_at);
    record.insert("status", "issued");
    record.insert("mode", "atomic");
    seed(&app.db, record, 0..3).await;

    let started = std::time::Instant::now();
    while app
        .count(
            "tokens",
            doc! { "origin.paymentIntentId": "pi_atomic_refunded", "status": "active" },
        )
        .await
        > 0
    {
        assert!(
            started.elapsed() < REPAIR_WITHIN,
            "the sweep left the refunded payment's tokens active"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let states = app.token_states("pi_atomic_refunded").await;
    assert_eq!(
        states,
        (0..3)
            .map(|i| (i, "revoked".to_owned()))
            .collect::<Vec<_>>()
    );
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}
