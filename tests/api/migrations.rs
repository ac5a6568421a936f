//! The migrator against a real mongod, each test on a fresh database: applying once,
//! checksums of applied files, duplicate reports before a unique index, concurrent
//! starts, batched backfill, dry runs; and the `migrate` / `duplicates` commands.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::{Client, Collection, Database};
use tokenmint::migrate::{MigrateError, migrations, parse, pending, run, verify_applied};
use tokenmint::store::{Store, StoreConfig};

use crate::helpers::{drop_database_blocking, mongo_uri};

/// The ids of every embedded migration, in order.
fn all() -> Vec<String> {
    let ids: Vec<String> = migrations().unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(
        ids[..3],
        [
            "0001_tokens_unique_payment_index",
            "0002_issuances_unique_payment_index",
            "0003_tokens_backfill_version",
        ]
    );
    ids
}

/// A freshly named database on the test mongod, dropped when the test ends (even when it
/// panics).
pub(crate) struct FreshDb {
    pub(crate) name: String,
    db: Database,
}

impl FreshDb {
    pub(crate) async fn new() -> Self {
        let name = format!("tokenmint_mig_{}", uuid::Uuid::new_v4().simple());
        let client = Client::with_uri_str(mongo_uri()).await.unwrap();
        Self {
            db: client.database(&name),
            name,
        }
    }

    pub(crate) async fn store(&self) -> Store {
        Store::connect(
            &mongo_uri(),
            &self.name,
            Duration::from_secs(2),
            10,
            StoreConfig {
                duplicate_key_retries: 3,
                ..StoreConfig::default()
            },
        )
        .await
        .expect("store")
    }

    pub(crate) fn collection(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    pub(crate) async fn count(&self, collection: &str, filter: Document) -> u64 {
        self.collection(collection)
            .count_documents(filter)
            .await
            .unwrap()
    }

    pub(crate) async fn applied(&self) -> Vec<Document> {
        self.collection("_migrations")
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }

    /// Names of the collections that exist.
    async fn collections(&self) -> Vec<String> {
        let mut names = self.db.list_collection_names().await.unwrap();
        names.sort();
        names
    }

    /// (name, unique) of every index on `collection`.
    async fn indexes(&self, collection: &str) -> Vec<(String, bool)> {
        self.collection(collection)
            .list_indexes()
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .into_iter()
            .map(|index| {
                let options = index.options.unwrap_or_default();
                (
                    options.name.unwrap_or_default(),
                    options.unique.unwrap_or(false),
                )
            })
            .collect()
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        drop_database_blocking(&self.name);
    }
}

/// A valid token document of payment `payment`, without `_version`.
pub(crate) fn token(payment: &str, index: i64) -> Document {
    let now = DateTime::now();
    doc! {
        "owner": ObjectId::parse_str(crate::helpers::OWNER).unwrap(),
        "type": "standard",
        "tokenIndex": index,
        "origin": {
            "provider": "stripe",
            "accountId": "acct_1",
            "paymentIntentId": payment,
            "date": now,
        },
        "status": "active",
        "createdAt": now,
        "updatedAt": now,
    }
}

/// The text of migration file `id` in `migrations/`.
fn migration_file(id: &str) -> String {
    let path = format!("{}/migrations/{id}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test]
async fn run_applies_every_migration_once() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    assert_eq!(
        pending(&store).await.unwrap(),
        all(),
        "all pending at first"
    );

    let started = DateTime::now();
    let report = run(&store, false).await.unwrap();
    assert_eq!(report.applied, all());
    assert!(report.already_applied.is_empty());

    let applied = fresh.applied().await;
    assert_eq!(applied.len(), all().len(), "{applied:?}");
    for (row, id) in applied.iter().zip(&all()) {
        assert_eq!(row.get_str("_id").unwrap(), id);
        let checksum = row.get_str("checksum").unwrap();
        assert_eq!(checksum.len(), 64, "{row}");
        assert!(
            checksum
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "lower-case hex: {row}"
        );
        assert_eq!(
            checksum,
            parse(id, &migration_file(id)).unwrap().checksum,
            "the checksum is the file's"
        );
        let applied_at = row.get_datetime("appliedAt").unwrap();
        assert!(*applied_at >= started, "{row}");
    }

    let tokens = fresh.indexes("tokens").await;
    assert!(
        tokens.contains(&("uniq_token_payment_index".to_owned(), true)),
        "{tokens:?}"
    );
    let issuances = fresh.indexes("issuances").await;
    assert!(
        issuances.contains(&("uniq_issuance_payment".to_owned(), true)),
        "{issuances:?}"
    );
    // The key order of the token index is the one in the file.
    let index = fresh
        .collection("tokens")
        .list_indexes()
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .into_iter()
        .find(|i| {
            i.options.as_ref().and_then(|o| o.name.as_deref()) == Some("uniq_token_payment_index")
        })
        .unwrap();
    let keys: Vec<&String> = index.keys.keys().collect();
    assert_eq!(
        keys,
        [
            "origin.provider",
            "origin.accountId",
            "origin.paymentIntentId",
            "tokenIndex"
        ]
    );

    // Again: nothing to do, nothing rewritten.
    let again = run(&store, false).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.already_applied, all());
    assert_eq!(fresh.applied().await, applied, "records untouched");
    assert!(pending(&store).await.unwrap().is_empty());
    verify_applied(&store).await.unwrap();
    assert_eq!(
        fresh.count("_migrations_lock", doc! {}).await,
        0,
        "the lock is released"
    );
}

#[tokio::test]
async fn an_edited_applied_migration_is_refused() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    run(&store, false).await.unwrap();
    let edited = "0".repeat(64);
    let result = fresh
        .collection("_migrations")
        .update_one(
            doc! { "_id": "0001_tokens_unique_payment_index" },
            doc! { "$set": { "checksum": &edited } },
        )
        .await
        .unwrap();
    assert_eq!(result.modified_count, 1);

    let check = |err: MigrateError| match err {
        MigrateError::ChecksumMismatch {
            id,
            applied,
            embedded,
        } => {
            assert_eq!(id, "0001_tokens_unique_payment_index");
            assert_eq!(applied, edited);
            assert_eq!(embedded, parse(&id, &migration_file(&id)).unwrap().checksum);
        }
        other => panic!("expected ChecksumMismatch, got {other:?}"),
    };
    let err = run(&store, false).await.unwrap_err();
    assert!(
        err.to_string().contains("0001_tokens_unique_payment_index"),
        "{err}"
    );
    check(err);
    check(verify_applied(&store).await.unwrap_err());
    check(run(&store, true).await.unwrap_err());
    // Nothing was changed by the refusals.
    assert_eq!(fresh.applied().await.len(), all().len());
    assert_eq!(
        fresh
            .count(
                "_migrations",
                doc! { "_id": "0001_tokens_unique_payment_index", "checksum": &edited }
            )
            .await,
        1
    );
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
}

#[tokio::test]
async fn duplicates_block_the_unique_index_with_a_report() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    fresh
        .collection("tokens")
        .insert_many([
            token("pi_dup", 0),
            token("pi_dup", 0),
            token("pi_dup", 1),
            token("pi_fine", 0),
        ])
        .await
        .unwrap();

    let err = run(&store, false).await.unwrap_err();
    let text = err.to_string();
    let MigrateError::Duplicates { id, report } = err else {
        panic!("expected Duplicates, got {err:?}")
    };
    assert_eq!(id, "0001_tokens_unique_payment_index");
    assert_eq!(report.index, "uniq_token_payment_index");
    assert_eq!(report.collection, "tokens");
    assert_eq!(report.groups.len(), 1, "{report}");
    let group = &report.groups[0];
    assert_eq!(group.count, 2);
    assert_eq!(group.sample_ids.len(), 2);
    assert_eq!(
        group.key.get_str("origin.paymentIntentId").unwrap(),
        "pi_dup"
    );
    assert!(
        matches!(
            group.key.get("tokenIndex"),
            Some(Bson::Int64(0) | Bson::Int32(0))
        ),
        "{}",
        group.key
    );
    assert!(text.contains("pi_dup"), "{text}");
    assert!(text.contains("uniq_token_payment_index"), "{text}");
    assert!(!text.contains("E11000"), "{text}");
    assert!(!text.contains("pi_fine"), "{text}");

    // Nothing applied, no index built, the lock released; the data is left alone.
    assert!(fresh.applied().await.is_empty());
    assert!(
        !fresh
            .indexes("tokens")
            .await
            .iter()
            .any(|(name, _)| name == "uniq_token_payment_index")
    );
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
    assert_eq!(fresh.count("tokens", doc! {}).await, 4);
    assert_eq!(pending(&store).await.unwrap(), all());

    // Once resolved, the migration applies.
    let group_ids = group.sample_ids.clone();
    fresh
        .collection("tokens")
        .delete_one(doc! { "_id": group_ids[1].clone() })
        .await
        .unwrap();
    assert_eq!(run(&store, false).await.unwrap().applied, all());
}

#[tokio::test]
async fn concurrent_runs_apply_each_migration_once() {
    let fresh = FreshDb::new().await;
    let (a, b) = (fresh.store().await, fresh.store().await);
    let (ra, rb) = tokio::join!(run(&a, false), run(&b, false));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut applied: Vec<String> = ra.applied.iter().chain(&rb.applied).cloned().collect();
    applied.sort();
    assert_eq!(
        applied,
        all(),
        "each migration applied by exactly one runner"
    );

    let rows = fresh.applied().await;
    let ids: Vec<&str> = rows.iter().map(|r| r.get_str("_id").unwrap()).collect();
    assert_eq!(ids, all());
    assert_eq!(fresh.count("_migrations_lock", doc! {}).await, 0);
    assert!(pending(&a).await.unwrap().is_empty());

    // Three at once on another fresh database, with one store shared by two of them.
    let fresh = FreshDb::new().await;
    let (a, b) = (fresh.store().await, fresh.store().await);
    let (ra, rb, rc) = tokio::join!(run(&a, false), run(&b, false), run(&a, false));
    let total = [ra.unwrap(), rb.unwrap(), rc.unwrap()]
        .iter()
        .map(|r| r.applied.len())
        .sum::<usize>();
    assert_eq!(total, all().len());
    assert_eq!(fresh.applied().await.len(), all().len());
}

#[tokio::test]
async fn backfill_gives_every_token_a_version() {
    const TOKENS: i64 = 2_500;
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    let docs: Vec<Document> = (0..TOKENS).map(|i| token("pi_backfill", i)).collect();
    fresh.collection("tokens").insert_many(docs).await.unwrap();
    // One token already past version 0 must keep its version.
    let mut versioned = token("pi_versioned", 0);
    versioned.insert("_version", 3_i64);
    fresh
        .collection("tokens")
        .insert_one(versioned)
        .await
        .unwrap();
    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        TOKENS as u64
    );

    assert_eq!(run(&store, false).await.unwrap().applied, all());

    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        0
    );
    assert_eq!(
        fresh
            .count(
                "tokens",
                doc! { "origin.paymentIntentId": "pi_backfill", "_version": 0 }
            )
            .await,
        TOKENS as u64
    );
    assert_eq!(
        fresh
            .count(
                "tokens",
                doc! { "origin.paymentIntentId": "pi_versioned", "_version": 3 }
            )
            .await,
        1
    );
    // `_version` is stored as an integer type ($inc-compatible), not a double.
    let sample = fresh
        .collection("tokens")
        .find_one(doc! { "origin.paymentIntentId": "pi_backfill" })
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            sample.get("_version"),
            Some(Bson::Int32(0) | Bson::Int64(0))
        ),
        "{sample}"
    );
    assert_eq!(fresh.count("tokens", doc! {}).await, TOKENS as u64 + 1);
}

#[tokio::test]
async fn a_dry_run_lists_and_writes_nothing() {
    let fresh = FreshDb::new().await;
    let store = fresh.store().await;
    fresh
        .collection("tokens")
        .insert_one(token("pi_dry", 0))
        .await
        .unwrap();

    let report = run(&store, true).await.unwrap();
    assert_eq!(report.applied, all());
    assert!(report.already_applied.is_empty());
    assert!(fresh.applied().await.is_empty());
    assert_eq!(
        fresh.collections().await,
        ["tokens"],
        "no _migrations, no lock, no issuances"
    );
    assert_eq!(
        fresh.indexes("tokens").await,
        [("_id_".to_owned(), false)],
        "no index built"
    );
    assert_eq!(
        fresh
            .count("tokens", doc! { "_version": { "$exists": false } })
            .await,
        1,
        "no backfill"
    );

    // After a real run, a dry run has nothing left to do.
    run(&store, false).await.unwrap();
    let report = run(&store, true).await.unwrap();
    assert!(report.applied.is_empty());
    assert_eq!(report.already_applied, all());
}

/// Runs the real `tokenmint` binary against database `db` of the test mongod; returns
/// (success, stdout, stderr). Killed after 60 s.
fn tokenmint(db: &str, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmint"))
        .args(args)
        .env("TOKENMINT__MONGO__URI", mongo_uri())
        .env("TOKENMINT__MONGO__DATABASE", db)
        .env("NO_COLOR", "1")
        .env_remove("TOKENMINT_CONFIG")
        .env_remove("TOKENMINT_ENV")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tokenmint binary runs");
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tokenmint {args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        stdout.join().unwrap(),
        stderr.join().unwrap(),
    )
}

/// Runs the binary off the async runtime.
async fn tokenmint_async(db: &str, args: &[&str]) -> (bool, String, String) {
    let db = db.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tokenmint(&db, &args)
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn cli_migrate_and_duplicates() {
    let fresh = FreshDb::new().await;

    let (ok, out, err) = tokenmint_async(&fresh.name, &["migrate", "--dry-run"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("would apply"), "{out}");
    for id in all() {
        assert!(out.contains(&id), "{out}");
    }
    assert!(fresh.applied().await.is_empty(), "a dry run writes nothing");

    let (ok, out, err) = tokenmint_async(&fresh.name, &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("applied"), "{out}");
    assert!(!out.contains("would apply"), "{out}");
    let rows = fresh.applied().await;
    assert_eq!(rows.len(), all().len());

    let (ok, out, err) = tokenmint_async(&fresh.name, &["migrate"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("nothing to apply"), "{out}");

    let (ok, out, err) = tokenmint_async(&fresh.name, &["duplicates"]).await;
    assert!(ok, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("no duplicates"), "{out}");
    assert_eq!(fresh.applied().await, rows, "duplicates changes nothing");
}

#[tokio::test]
async fn cli_reports_duplicates_and_refuses_to_migrate() {
    let fresh = FreshDb::new().await;
    fresh
        .collection("tokens")
        .insert_many([token("pi_cli_dup", 0), token("pi_cli_dup", 0)])
        .await
        .unwrap();

    let (ok, out, err) = tokenmint_async(&fresh.name, &["duplicates"]).await;
    assert!(
        !ok,
        "duplicates found is a failure\nstdout: {out}\nstderr: {err}"
    );
    assert!(out.contains("uniq_token_payment_index"), "{out}");
    assert!(out.contains("pi_cli_dup"), "{out}");
    assert!(out.contains("2 x"), "the group and its size: {out}");
    assert!(out.contains("1 group(s) of duplicates"), "{out}");

    let (ok, out, err) = tokenmint_async(&fresh.name, &["migrate"]).await;
    assert!(!ok, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("pi_cli_dup"), "{err}");
    assert!(!err.contains("E11000"), "{err}");
    assert!(fresh.applied().await.is_empty());
    assert_eq!(fresh.count("tokens", doc! {}).await, 2);
}
