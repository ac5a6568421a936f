//! The migrator under load, against a real mongod: a lease renewed while a long step runs
//! (a second migrator keeps waiting), a lease lost mid-step (nothing recorded, a clear
//! error), a migration recorded meanwhile by another instance (same checksum: carry on;
//! another: refuse), a backfill racing writers that insert and version documents, and a
//! token without `_version` redeemed over HTTP.
//!
//! Long steps are made with a short lease and a backfill whose filter sleeps on the server
//! (`$where` with `sleep`), so a step outlasts its lease without the test sleeping long.

use std::time::Duration;

use mongodb::bson::{DateTime, Document, doc};
use serde_json::json;
use tokenmint::migrate::{LeaseTiming, MigrateError, Migration, apply, parse};

use crate::helpers::*;
use crate::migrations::{FreshDb, token};

/// A lease shorter than the slow step: renewed every second, it leaves two seconds of
/// slack to a renewal delayed by a busy machine. A waiting migrator waits as long as the
/// standard one.
const LEASE: LeaseTiming = LeaseTiming {
    length: Duration::from_secs(3),
    patience: Duration::from_secs(300),
};
/// Documents the slow backfill goes through, one per batch.
const SLOW_DOCS: usize = 16;

/// A migration `id` whose one step backfills `slow` one document per batch, with a filter
/// that sleeps 150 ms on the server per document examined (each batch reads one and
/// updates one): at least 4.8 s for `SLOW_DOCS` (the sleeps are a lower bound), over 1.5
/// leases, so a lease that is not renewed always runs out mid-step.
fn slow_migration(id: &str) -> Migration {
    let text = r#"{
  "description": "a backfill slow enough to outlast its lease",
  "steps": [ { "backfill": {
    "collection": "slow",
    "filter": { "done": { "$exists": false }, "$where": "sleep(150) || true" },
    "set": { "done": true },
    "batchSize": 1
  } } ]
}"#;
    parse(id, text).unwrap()
}

async fn seed_slow(fresh: &FreshDb) {
    let docs: Vec<Document> = (0..SLOW_DOCS as i64).map(|i| doc! { "n": i }).collect();
    fresh.collection("slow").insert_many(docs).await.unwrap();
}

/// Waits until the slow backfill has done at least one document: the step is running and
/// its migrator holds the lease.
async fn wait_until_step_runs(fresh: &FreshDb) {
    for _ in 0..200 {
        if fresh.count("slow", doc! { "done": true }).await > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the slow step never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_step_keeps_its_lease_while_a_second_migrator_waits() {
    let fresh = FreshDb::new().await;
    seed_slow(&fresh).await;
    let (a, b) = (fresh.store().await, fresh.store().await);
    let first =
        tokio::spawn(async move { apply(&a, vec![slow_migration("9001_slow")], LEASE).await });
    wait_until_step_runs(&fresh).await;
    // Watches who holds the lease until the migration is recorded: with no renewal, the
    // second migrator would take the lease over once the first lease ran out.
    let watcher = {
        let lock = fresh.collection("_migrations_lock");
        let applied = fresh.collection("_migrations");
        tokio::spawn(async move {
            let mut holders: Vec<String> = Vec::new();
            while applied.count_documents(doc! {}).await.unwrap() == 0 {
                if let Some(row) = lock.find_one(doc! {}).await.unwrap() {
                    let holder = row.get_str("holder").unwrap().to_owned();
                    if !holders.contains(&holder) {
                        holders.push(holder);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            holders
        })
    };
    // Its patience is shorter than the step: it waits on because the holder renews.
    let patient = LeaseTiming {
        patience: Duration::from_millis(2500),
        ..LEASE
    };
    let second = apply(&b, vec![slow_migration("9001_slow")], patient).await;
    let first = first.await.unwrap();

    let first = first.expect("the holder keeps its lease through a step longer than it");
    let second = second.expect("the waiting migrator finds the work done");
    assert_eq!(first.applied, ["9001_slow"]);
    assert_eq!(second.already_applied, ["9001_slow"]);
    assert!(second.applied.is_empty());
    assert_eq!(watcher.await.unwrap().len(), 1, "one holder until recorded");
    assert_eq!(fresh.applied().await.len(), 1);
    assert_eq!(
        fresh.count("slow", doc! { "done": true }).await,
        SLOW_DOCS as u64
    );
    assert_eq!(
        fresh.count("_migrations_lock", doc! {}).await,
        0,
        "released"
    );
}

/// A renewal the database fails to answer (an election's error, the driver's own retry
/// failing too) says nothing of the lease, which is still the holder's: it is tried
/// again, and the migration goes through, recorded once, by the one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_the_database_fails_is_tried_again_and_the_lease_kept() {
    let fresh = FreshDb::new().await;
    seed_slow(&fresh).await;
    let app_name = unique_app_name();
    let store = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let turn = FailPointTurn::take().await;
    // Renewed every 2 s, the lease leaves a renewal 2 s to get through: the driver's own
    // retry of a ShutdownInProgress waits for the server to be checked again first.
    let lease = LeaseTiming {
        length: LEASE.length * 2,
        ..LEASE
    };
    let run =
        tokio::spawn(async move { apply(&store, vec![slow_migration("9004_slow")], lease).await });
    wait_until_step_runs(&fresh).await;
    // The next renewal, and the driver's retry of it, answer ShutdownInProgress.
    let lock = format!("{}._migrations_lock", fresh.name());
    let failpoint = turn
        .set_on(&app_name, &["update"], &lock, Fault::error(91), 2)
        .await;
    let report = run
        .await
        .unwrap()
        .expect("a renewal the database failed is tried again");
    assert_eq!(report.applied, ["9004_slow"]);
    assert_eq!(
        failpoint.off().await,
        2,
        "the renewal failed, and its retry"
    );
    assert_eq!(fresh.applied().await.len(), 1);
    assert_eq!(
        fresh.count("slow", doc! { "done": true }).await,
        SLOW_DOCS as u64
    );
}

/// A waiting migrator whose try for the lease the database fails (an election's error,
/// the driver's retry failing too) waits on, and finds the work done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_try_the_database_fails_waits_on() {
    let fresh = FreshDb::new().await;
    seed_slow(&fresh).await;
    let holder = fresh.store().await;
    let app_name = unique_app_name();
    let waiter = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let turn = FailPointTurn::take().await;
    let first =
        tokio::spawn(async move { apply(&holder, vec![slow_migration("9005_slow")], LEASE).await });
    wait_until_step_runs(&fresh).await;
    let lock = format!("{}._migrations_lock", fresh.name());
    let failpoint = turn
        .set_on(&app_name, &["findAndModify"], &lock, Fault::error(91), 2)
        .await;
    let second = apply(&waiter, vec![slow_migration("9005_slow")], LEASE)
        .await
        .expect("a try the database failed is tried again");
    assert_eq!(second.already_applied, ["9005_slow"]);
    let first = first.await.unwrap().expect("the holder is not disturbed");
    assert_eq!(first.applied, ["9005_slow"]);
    assert_eq!(failpoint.off().await, 2, "the try failed, and its retry");
}

/// A start while the set elects: its first try for the lease and the read of the holder
/// both fail (no primary yet), before the database ever answered it. It waits for the
/// new primary and migrates, rather than ending the start.
#[tokio::test]
async fn a_start_whose_first_tries_the_database_fails_waits_for_it() {
    let fresh = FreshDb::new().await;
    seed_slow(&fresh).await;
    let app_name = unique_app_name();
    let starting = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let turn = FailPointTurn::take().await;
    let lock = format!("{}._migrations_lock", fresh.name());
    // Four: the driver retries each command once on this error.
    let failpoint = turn
        .set_on(
            &app_name,
            &["findAndModify", "find"],
            &lock,
            Fault::error(91),
            4,
        )
        .await;
    let applied = apply(&starting, vec![slow_migration("9006_slow")], LEASE)
        .await
        .expect("a database failing its first tries is waited for");
    assert_eq!(applied.applied, ["9006_slow"]);
    assert_eq!(
        failpoint.off().await,
        4,
        "the try and the holder's read failed, each with its retry"
    );
}

#[tokio::test]
async fn a_lost_lease_records_nothing_and_stops_with_a_clear_error() {
    // Taken over by another instance, and simply run out (its holder was paused).
    let thefts = [
        doc! { "$set": { "holder": "another-instance", "expiresAt": DateTime::from_millis(DateTime::now().timestamp_millis() + 600_000) } },
        doc! { "$set": { "expiresAt": DateTime::from_millis(0) } },
    ];
    for theft in thefts {
        let fresh = FreshDb::new().await;
        seed_slow(&fresh).await;
        let store = fresh.store().await;
        let run =
            tokio::spawn(
                async move { apply(&store, vec![slow_migration("9002_slow")], LEASE).await },
            );
        wait_until_step_runs(&fresh).await;
        fresh
            .collection("_migrations_lock")
            .update_one(doc! { "_id": "lock" }, theft.clone())
            .await
            .unwrap();

        let err = run
            .await
            .unwrap()
            .expect_err("a migrator without its lease must stop");
        assert!(
            matches!(&err, MigrateError::LeaseLost { id } if id == "9002_slow"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("lost the migration lease"), "{message}");
        assert!(message.contains("9002_slow was not finished"), "{message}");
        assert!(
            fresh.applied().await.is_empty(),
            "nothing recorded after {theft}"
        );
        assert!(
            fresh.count("slow", doc! { "done": true }).await < SLOW_DOCS as u64,
            "the step stopped when the lease was lost, not at its end"
        );
    }
}

/// A renewal the database holds (a majority that does not come back, a blocked
/// connection) is given up when the lease can no longer be vouched for: the step stops
/// then, not when the held renewal comes back long after another instance took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_held_past_its_lease_stops_the_step() {
    let fresh = FreshDb::new().await;
    seed_slow(&fresh).await;
    let app_name = unique_app_name();
    let store = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let turn = FailPointTurn::take().await;
    let run =
        tokio::spawn(async move { apply(&store, vec![slow_migration("9008_slow")], LEASE).await });
    wait_until_step_runs(&fresh).await;
    // The next renewal waits 8 s (the lease lasts 3): long past the step's own end.
    let lock = format!("{}._migrations_lock", fresh.name());
    let failpoint = turn
        .set_on(
            &app_name,
            &["update"],
            &lock,
            Fault::Block { millis: 8_000 },
            1,
        )
        .await;
    let err = run
        .await
        .unwrap()
        .expect_err("a migrator that cannot vouch for its lease must stop");
    assert!(
        matches!(&err, MigrateError::LeaseLost { id } if id == "9008_slow"),
        "{err:?}"
    );
    assert!(
        fresh.count("slow", doc! { "done": true }).await < SLOW_DOCS as u64,
        "the step stopped when the renewal was held, not at its end"
    );
    assert!(fresh.applied().await.is_empty());
    drop(failpoint);
}

/// A record held past the lease (its majority slow to come back) leaves the next
/// migration to a migrator that may have lost the lease: it confirms the lease before
/// that migration's first step, and stops without running it.
#[tokio::test]
async fn a_record_held_past_the_lease_runs_no_step_of_the_next_migration() {
    let fresh = FreshDb::new().await;
    let app_name = unique_app_name();
    let store = connect_store(&mongo_uri_named(&app_name), fresh.name()).await;
    let turn = FailPointTurn::take().await;
    let index = |id: &str, name: &str| {
        let text = format!(
            r#"{{ "description": "an index", "steps": [ {{ "createIndex": {{
                "collection": "held", "name": "{name}", "keys": {{ "{name}": 1 }} }} }} ] }}"#
        );
        parse(id, &text).unwrap()
    };
    let applied = format!("{}._migrations", fresh.name());
    let failpoint = turn
        .set_on(
            &app_name,
            &["insert"],
            &applied,
            Fault::Block { millis: 4_000 },
            1,
        )
        .await;
    let err = apply(
        &store,
        vec![index("9009_first", "first"), index("9010_second", "second")],
        LEASE,
    )
    .await
    .expect_err("the lease ran out while the first migration was recorded");
    assert!(
        matches!(&err, MigrateError::LeaseLost { id } if id == "9010_second"),
        "{err:?}"
    );
    drop(failpoint);
    let names: Vec<String> = fresh
        .indexes("held")
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"first".to_owned()), "{names:?}");
    assert!(
        !names.contains(&"second".to_owned()),
        "no step without the lease: {names:?}"
    );
    let recorded: Vec<String> = fresh
        .applied()
        .await
        .iter()
        .map(|row| row.get_str("_id").unwrap().to_owned())
        .collect();
    assert_eq!(recorded, ["9009_first"]);
}

#[tokio::test]
async fn a_migration_recorded_meanwhile_is_checked_and_not_an_error() {
    for (checksum_matches, id) in [(true, "9003_slow"), (false, "9004_slow")] {
        let fresh = FreshDb::new().await;
        seed_slow(&fresh).await;
        let store = fresh.store().await;
        let migration = slow_migration(id);
        let checksum = if checksum_matches {
            migration.checksum.clone()
        } else {
            "0".repeat(64)
        };
        let run = tokio::spawn(async move { apply(&store, vec![migration], LEASE).await });
        // Another instance records it while this one is mid-step (after its first check).
        wait_until_step_runs(&fresh).await;
        fresh
            .collection("_migrations")
            .insert_one(doc! { "_id": id, "checksum": &checksum, "description": "elsewhere" })
            .await
            .unwrap();

        let result = run.await.unwrap();
        if checksum_matches {
            let report = result.expect("already applied by another instance: carry on");
            assert!(report.applied.is_empty());
            assert_eq!(report.already_applied, [id]);
        } else {
            let err = result.expect_err("a different checksum is the edited-migration error");
            assert!(
                matches!(&err, MigrateError::ChecksumMismatch { id: i, .. } if i == id),
                "{err:?}"
            );
        }
        let rows = fresh.applied().await;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0].get_str("checksum").unwrap(),
            checksum,
            "the first record stays"
        );
    }
}

#[tokio::test]
async fn a_backfill_runs_until_nothing_matches_despite_concurrent_writers() {
    const INITIAL: i64 = 400;
    const WRITES: i64 = 100;
    let fresh = FreshDb::new().await;
    let docs: Vec<Document> = (0..INITIAL).map(|i| doc! { "n": i }).collect();
    fresh.collection("items").insert_many(docs).await.unwrap();
    let migration = parse(
        "9005_backfill",
        r#"{"description": "version items", "steps": [ { "backfill": {
            "collection": "items", "filter": { "v": { "$exists": false } },
            "set": { "v": 0 }, "batchSize": 1 } } ]}"#,
    )
    .unwrap();
    let store = fresh.store().await;
    let migrator = tokio::spawn(async move { apply(&store, vec![migration], LEASE).await });
    // A writer inserting unversioned documents, and versioning the very document the
    // backfill reads next (the oldest one left), so whole batches match nothing.
    let items = fresh.collection("items");
    for i in 0..WRITES {
        items.insert_one(doc! { "n": INITIAL + i }).await.unwrap();
        items
            .find_one_and_update(
                doc! { "v": { "$exists": false } },
                doc! { "$set": { "v": 1 } },
            )
            .sort(doc! { "_id": 1 })
            .await
            .unwrap();
    }
    assert!(
        !migrator.is_finished(),
        "the writer must finish while the backfill runs"
    );
    let report = migrator.await.unwrap().unwrap();

    assert_eq!(report.applied, ["9005_backfill"]);
    assert_eq!(
        fresh
            .count("items", doc! { "v": { "$exists": false } })
            .await,
        0
    );
    assert_eq!(fresh.count("items", doc! { "v": 1 }).await, WRITES as u64);
    assert_eq!(
        fresh.count("items", doc! {}).await,
        (INITIAL + WRITES) as u64
    );
}

#[tokio::test]
async fn a_backfill_whose_filter_never_runs_dry_is_refused() {
    let fresh = FreshDb::new().await;
    fresh
        .collection("items")
        .insert_one(doc! { "v": 0 })
        .await
        .unwrap();
    let migration = parse(
        "9006_endless",
        r#"{"description": "never dry", "steps": [ { "backfill": {
            "collection": "items", "filter": { "v": 0 }, "set": { "v": 0 }, "batchSize": 10 } } ]}"#,
    )
    .unwrap();
    let err = apply(&fresh.store().await, vec![migration], LEASE)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MigrateError::InvalidFile { id, .. } if id == "9006_endless"),
        "{err:?}"
    );
    assert!(err.to_string().contains("never runs dry"), "{err}");
    assert!(fresh.applied().await.is_empty());
}

#[tokio::test]
async fn a_token_without_version_passes_the_version_gate() {
    let app = spawn_app().await;
    let response = app
        .issue(ADMIN_KEY, &issuance_body("pi_unversioned", 3))
        .await;
    assert_eq!(response.status(), 201);
    let ids = token_ids(&json(response).await);
    // Tokens as written before the version gate existed (the backfill has not run yet).
    let old: Vec<Document> = (0..3).map(|i| token("pi_unversioned", i)).collect();
    let tokens = app.db.collection::<Document>("tokens");
    for (id, mut document) in ids.iter().zip(old) {
        let oid = mongodb::bson::oid::ObjectId::parse_str(id).unwrap();
        document.insert("_id", oid);
        tokens
            .replace_one(doc! { "_id": oid }, document)
            .await
            .unwrap();
    }
    assert_eq!(
        app.count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        3
    );
    let redeem = |id: &str, if_match: Option<&str>| {
        let mut request = app
            .http
            .post(app.url(&format!("/v1/tokens/{id}/redeem")))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({}));
        if let Some(tag) = if_match {
            request = request.header("if-match", tag);
        }
        request.send()
    };

    let read = app.get(ADMIN_KEY, &format!("/v1/tokens/{}", ids[0])).await;
    assert_eq!(read.headers()["etag"], "\"0\"", "read as version 0");
    for (id, if_match) in [(&ids[0], None), (&ids[1], Some("\"0\""))] {
        let response = redeem(id, if_match).await.unwrap();
        assert_eq!(response.status(), 200, "{if_match:?}");
        assert_eq!(response.headers()["etag"], "\"1\"");
        let stored = tokens
            .find_one(doc! { "_id": mongodb::bson::oid::ObjectId::parse_str(id).unwrap() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.get_str("status").unwrap(), "redeemed");
        assert_eq!(
            stored
                .get("_version")
                .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from))),
            Some(1)
        );
    }
    // The gate still refuses a stale version on such a token, writing nothing.
    assert_problem(
        redeem(&ids[2], Some("\"1\"")).await.unwrap(),
        412,
        "version_conflict",
    )
    .await;
    assert_eq!(
        app.count(
            "tokens",
            doc! { "status": "active", "_version": { "$exists": false } }
        )
        .await,
        1
    );
}
