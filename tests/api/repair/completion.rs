//! The sweep: a short set is completed without any request, a record that is too young
//! or leased by another instance is left alone, and two instances repairing at once
//! write each token once.

use std::time::{Duration, Instant};

use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};

use super::{
    FAST_REPAIR, REPAIR_WITHIN, Seeded, ago, assert_completed, issuing_record, record_of, repairs,
    seed, token, wait_until_none_issuing,
};
use crate::helpers::*;

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

/// An unfinished record the database refuses to lease (here a validator refuses the
/// lease's write for it alone, every time) is the oldest, so every sweep meets it first:
/// it is counted failed and passed over, and the records behind it are repaired all the
/// same.
#[tokio::test]
async fn a_record_the_database_will_not_lease_does_not_keep_the_others_unrepaired() {
    let app = spawn_app_with(FAST_REPAIR).await;
    let failed_before = repairs(&app, "failed").await;
    seed(
        &app.db,
        issuing_record(
            "pi_unleasable",
            ObjectId::new(),
            3,
            ago(Duration::from_secs(7200)),
        ),
        0..1,
    )
    .await;
    app.db
        .run_command(doc! {
            "collMod": "issuances",
            "validator": { "$or": [
                { "paymentIntentId": { "$ne": "pi_unleasable" } },
                { "repairLeaseUntil": { "$exists": false } },
            ] },
        })
        .await
        .unwrap();
    let behind = seed(
        &app.db,
        issuing_record(
            "pi_behind",
            ObjectId::new(),
            4,
            ago(Duration::from_secs(3600)),
        ),
        0..2,
    )
    .await;

    let started = Instant::now();
    while record_of(&app.db, &behind.payment).await.get_str("status") != Ok("issued") {
        assert!(
            started.elapsed() < REPAIR_WITHIN,
            "the record behind the unleasable one was not repaired within {REPAIR_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_completed(&app.db, &behind).await;
    let stuck = record_of(&app.db, "pi_unleasable").await;
    assert_eq!(stuck.get_str("status"), Ok("issuing"), "{stuck}");
    assert!(!stuck.contains_key("repairLeaseUntil"), "{stuck}");
    assert!(repairs(&app, "failed").await > failed_before);
}
