//! Applies migrations. Several instances may start at once: a lease in
//! `_migrations_lock` lets one of them apply while the others wait, then find
//! everything applied. Steps are idempotent too, so a holder that dies mid-migration
//! (its lease expires) leaves nothing a successor cannot redo.

use std::collections::HashMap;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::options::IndexOptions;

use super::{
    BackfillStep, DuplicateReport, IndexStep, Migration, Step, find_duplicates, migrations,
};
use crate::store::{Store, StoreError, duplicate_key_index};

const APPLIED: &str = "_migrations";
const LOCK: &str = "_migrations_lock";
/// A lease long enough for any step; renewed before each migration.
const LEASE: Duration = Duration::from_secs(120);
/// How long a waiting instance waits for the lease before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(300);

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("migration file {id} is invalid: {message}")]
    InvalidFile { id: String, message: String },
    #[error(
        "migration {id} was applied with checksum {applied} but the embedded file now has {embedded}; \
         applied migrations must never be edited (add a new migration instead)"
    )]
    ChecksumMismatch {
        id: String,
        applied: String,
        embedded: String,
    },
    #[error("migration {id} cannot create a unique index:\n{report}")]
    Duplicates { id: String, report: DuplicateReport },
    #[error("another instance has held the migration lock for over {0:?}")]
    LockTimeout(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<mongodb::error::Error> for MigrateError {
    fn from(err: mongodb::error::Error) -> Self {
        Self::Store(err.into())
    }
}

/// What a run did (or, dry, would do).
#[derive(Debug, Default)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    pub already_applied: Vec<String>,
}

/// Applies every pending migration, or with `dry_run` only lists them. Always verifies
/// the checksums of applied ones.
pub async fn run(store: &Store, dry_run: bool) -> Result<MigrationReport, MigrateError> {
    let all = migrations()?;
    if dry_run {
        let applied = verify(store, &all).await?;
        return Ok(split(all, &applied));
    }
    let holder = uuid::Uuid::new_v4().to_string();
    acquire_lock(store, &holder).await?;
    let result = apply_pending(store, &holder, all).await;
    // Release even on failure; if this fails the lease simply expires.
    let _ = store
        .collection(LOCK)
        .delete_one(doc! { "_id": "lock", "holder": &holder })
        .await;
    result
}

/// Ids of embedded migrations not yet applied (readiness uses this).
pub async fn pending(store: &Store) -> Result<Vec<String>, MigrateError> {
    let all = migrations()?;
    let applied = applied_checksums(store).await?;
    Ok(all
        .into_iter()
        .filter(|m| !applied.contains_key(&m.id))
        .map(|m| m.id)
        .collect())
}

/// Fails when an applied migration's file was edited since.
pub async fn verify_applied(store: &Store) -> Result<(), MigrateError> {
    verify(store, &migrations()?).await.map(|_| ())
}

async fn apply_pending(
    store: &Store,
    holder: &str,
    all: Vec<Migration>,
) -> Result<MigrationReport, MigrateError> {
    let applied = verify(store, &all).await?;
    let mut report = MigrationReport::default();
    for migration in all {
        if applied.contains_key(&migration.id) {
            report.already_applied.push(migration.id);
            continue;
        }
        renew_lock(store, holder).await?;
        tracing::info!(migration = %migration.id, "applying migration");
        for step in &migration.steps {
            match step {
                Step::CreateIndex(index) => create_index(store, &migration.id, index).await?,
                Step::Backfill(backfill) => run_backfill(store, backfill).await?,
            }
        }
        store
            .collection(APPLIED)
            .insert_one(doc! {
                "_id": &migration.id,
                "checksum": &migration.checksum,
                "description": &migration.description,
                "appliedAt": DateTime::now(),
            })
            .await?;
        report.applied.push(migration.id);
    }
    Ok(report)
}

fn split(all: Vec<Migration>, applied: &HashMap<String, String>) -> MigrationReport {
    let (done, todo): (Vec<_>, Vec<_>) = all.into_iter().partition(|m| applied.contains_key(&m.id));
    MigrationReport {
        applied: todo.into_iter().map(|m| m.id).collect(),
        already_applied: done.into_iter().map(|m| m.id).collect(),
    }
}

async fn applied_checksums(store: &Store) -> Result<HashMap<String, String>, MigrateError> {
    let rows: Vec<Document> = store
        .collection(APPLIED)
        .find(doc! {})
        .await?
        .try_collect()
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            Some((
                row.get_str("_id").ok()?.to_owned(),
                row.get_str("checksum").ok()?.to_owned(),
            ))
        })
        .collect())
}

async fn verify(store: &Store, all: &[Migration]) -> Result<HashMap<String, String>, MigrateError> {
    let applied = applied_checksums(store).await?;
    for migration in all {
        if let Some(checksum) = applied.get(&migration.id)
            && *checksum != migration.checksum
        {
            return Err(MigrateError::ChecksumMismatch {
                id: migration.id.clone(),
                applied: checksum.clone(),
                embedded: migration.checksum.clone(),
            });
        }
    }
    Ok(applied)
}

async fn acquire_lock(store: &Store, holder: &str) -> Result<(), MigrateError> {
    let started = tokio::time::Instant::now();
    loop {
        if try_lock(store, holder).await? {
            return Ok(());
        }
        if started.elapsed() > LOCK_WAIT {
            return Err(MigrateError::LockTimeout(LOCK_WAIT));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn renew_lock(store: &Store, holder: &str) -> Result<(), MigrateError> {
    if try_lock(store, holder).await? {
        Ok(())
    } else {
        Err(MigrateError::LockTimeout(LEASE))
    }
}

/// Takes (or renews) the lease when it is free, expired or already ours. A duplicate key
/// on `_id` means another live holder has it.
async fn try_lock(store: &Store, holder: &str) -> Result<bool, MigrateError> {
    let now = DateTime::now();
    let expires = DateTime::from_millis(now.timestamp_millis() + LEASE.as_millis() as i64);
    let result = store
        .collection(LOCK)
        .update_one(
            doc! { "_id": "lock", "$or": [ { "holder": holder }, { "expiresAt": { "$lt": now } } ] },
            doc! { "$set": { "holder": holder, "expiresAt": expires } },
        )
        .upsert(true)
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(err) if duplicate_key_index(&err).is_some() => Ok(false),
        Err(err) => Err(err.into()),
    }
}

async fn create_index(
    store: &Store,
    migration: &str,
    index: &IndexStep,
) -> Result<(), MigrateError> {
    let duplicates = || async {
        let report = find_duplicates(store, index).await?;
        Ok::<_, MigrateError>(MigrateError::Duplicates {
            id: migration.to_owned(),
            report,
        })
    };
    if index.unique {
        let report = find_duplicates(store, index).await?;
        if !report.groups.is_empty() {
            return Err(MigrateError::Duplicates {
                id: migration.to_owned(),
                report,
            });
        }
    }
    let options = IndexOptions::builder()
        .name(index.name.clone())
        .unique(index.unique.then_some(true))
        .partial_filter_expression(index.partial_filter_expression.clone())
        .expire_after(
            index
                .expire_after_seconds
                .map(std::time::Duration::from_secs),
        )
        .build();
    let model = IndexModel::builder()
        .keys(index.keys.clone())
        .options(options)
        .build();
    match store
        .collection(&index.collection)
        .create_index(model)
        .await
    {
        Ok(_) => Ok(()),
        // A duplicate written between the check and the build: report it the same way.
        Err(err) if duplicate_key_index(&err).is_some() || is_duplicate_build_error(&err) => {
            Err(duplicates().await?)
        }
        Err(err) => Err(err.into()),
    }
}

/// Index builds report duplicates as a command error with code 11000.
fn is_duplicate_build_error(err: &mongodb::error::Error) -> bool {
    matches!(err.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 11000)
}

async fn run_backfill(store: &Store, step: &BackfillStep) -> Result<(), MigrateError> {
    let collection = store.collection(&step.collection);
    let mut total = 0u64;
    loop {
        let batch: Vec<Document> = collection
            .find(step.filter.clone())
            .projection(doc! { "_id": 1 })
            .limit(i64::from(step.batch_size))
            .await?
            .try_collect()
            .await?;
        if batch.is_empty() {
            break;
        }
        let ids: Vec<Bson> = batch
            .into_iter()
            .filter_map(|d| d.get("_id").cloned())
            .collect();
        // Re-apply the filter so a document changed since the read is left alone.
        let mut filter = step.filter.clone();
        filter.insert("_id", doc! { "$in": ids });
        let result = collection
            .update_many(filter, doc! { "$set": step.set.clone() })
            .await?;
        total += result.modified_count;
        if result.modified_count == 0 {
            break;
        }
    }
    if total > 0 {
        tracing::info!(collection = %step.collection, documents = total, "backfill done");
    }
    Ok(())
}
