//! Applies migrations. Several instances may start at once: a lease in
//! `_migrations_lock` (`lease.rs`) lets one of them apply while the others wait, then
//! find everything applied. The lease is renewed while a step runs and confirmed before
//! a migration is recorded, so an instance that lost it records nothing. Steps are
//! idempotent too, so a holder that dies mid-migration (its lease expires) leaves nothing
//! a successor cannot redo.

use std::collections::HashMap;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, doc};

use super::kept::{LostIndex, lost};
use super::lease::{Lease, POLL, UNANSWERED_PATIENCE};
use super::steps::{backfill, create_index, drop_index};
use super::{DuplicateReport, Migration, Step, migrations};
use crate::store::{Store, StoreError, duplicate_key_index};

const APPLIED: &str = "_migrations";
/// How long a migrator's lease lasts, and how long a waiting one waits for it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// The lease of a running migrator: renewed every third of it while a step runs, so
    /// it only runs out when its holder stops (dies, hangs, or is cut off from the
    /// database).
    pub length: Duration,
    /// How long a waiting migrator waits without seeing the holder renew before it gives
    /// up. A holder that keeps renewing is working (an index build may take hours): it
    /// is waited for as long as it does.
    pub patience: Duration,
}

/// What `run` applies under.
const STANDARD_LEASE: LeaseTiming = LeaseTiming {
    length: Duration::from_secs(60),
    patience: Duration::from_secs(300),
};

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
    #[error(
        "indexes that applied migrations built are not there as built: {}; `tokenmint migrate` builds the missing ones again",
        .0.join(", ")
    )]
    IndexesMissing(Vec<String>),
    #[error("another instance has held the migration lock for over {0:?} without renewing it")]
    LockTimeout(Duration),
    #[error(
        "lost the migration lease during {id} (it ran out, or another instance took it \
         over): {id} was not finished, and the next run does it again"
    )]
    LeaseLost { id: String },
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
    /// Indexes of applied migrations the database had lost, built again (`kept.rs`), each
    /// as `collection.name (migration)`.
    pub recreated: Vec<String>,
}

/// Applies every pending embedded migration, after building again any index an applied
/// one built that the database lost; or with `dry_run` only lists both. Always verifies
/// the checksums of applied ones.
pub async fn run(store: &Store, dry_run: bool) -> Result<MigrationReport, MigrateError> {
    let all = migrations()?;
    if dry_run {
        let applied = verify(store, &all).await?;
        let lost = lost(store, &all, &applied).await?;
        refuse_unbuildable(&lost)?;
        let recreated = lost.iter().map(LostIndex::describe).collect();
        return Ok(MigrationReport {
            recreated,
            ..split(all, &applied)
        });
    }
    apply(store, all, STANDARD_LEASE).await
}

/// The indexes applied migrations built that the database does not have as built, each
/// as `collection.name (migration)`, with what to do when a run cannot build it again
/// (`verify` reports them).
pub async fn missing_indexes(store: &Store) -> Result<Vec<String>, MigrateError> {
    let all = migrations()?;
    let applied = applied_checksums(store).await?;
    let lost = lost(store, &all, &applied).await?;
    Ok(lost.iter().map(LostIndex::finding).collect())
}

/// A run stops before any work when an index is there in another shape: building it
/// again would fail on its name or keys with the database's own error.
fn refuse_unbuildable(lost: &[LostIndex<'_>]) -> Result<(), MigrateError> {
    let unbuildable: Vec<String> = lost
        .iter()
        .filter(|lost| !lost.rebuildable())
        .map(LostIndex::finding)
        .collect();
    if unbuildable.is_empty() {
        Ok(())
    } else {
        Err(MigrateError::IndexesMissing(unbuildable))
    }
}

/// Applies the pending ones of `all`, in order, under a lease timed by `lease`: what
/// `run` does with the embedded files and the standard lease. Tests pass their own
/// migrations and short leases.
pub async fn apply(
    store: &Store,
    all: Vec<Migration>,
    lease: LeaseTiming,
) -> Result<MigrationReport, MigrateError> {
    let lease = Lease::acquire(store, lease.length, lease.patience).await?;
    let result = apply_pending(store, &lease, all).await;
    lease.release().await;
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

/// Fails when an applied migration's file was edited since, or when an index one built is
/// missing (a start that may not change the schema cannot build it again, and must not
/// serve without it). A database that does not answer (a start while the set elects) is
/// waited for as a start that migrates waits for it (`UNANSWERED_PATIENCE`), then its
/// unavailability is the error.
pub async fn verify_applied(store: &Store) -> Result<(), MigrateError> {
    let all = migrations()?;
    let started = tokio::time::Instant::now();
    let applied = loop {
        match verify(store, &all).await {
            Err(MigrateError::Store(err @ StoreError::Unavailable(_)))
                if started.elapsed() < UNANSWERED_PATIENCE =>
            {
                tracing::warn!(error = %err, "cannot read the applied migrations yet; trying again");
                tokio::time::sleep(POLL).await;
            }
            outcome => break outcome?,
        }
    };
    let lost = lost(store, &all, &applied).await?;
    if lost.is_empty() {
        Ok(())
    } else {
        Err(MigrateError::IndexesMissing(
            lost.iter().map(LostIndex::finding).collect(),
        ))
    }
}

async fn apply_pending(
    store: &Store,
    lease: &Lease,
    all: Vec<Migration>,
) -> Result<MigrationReport, MigrateError> {
    let applied = verify(store, &all).await?;
    let mut report = MigrationReport::default();
    let lost = lost(store, &all, &applied).await?;
    refuse_unbuildable(&lost)?;
    for lost in lost {
        tracing::warn!(index = %lost.describe(), holder = lease.holder_id(), "building again an index an applied migration built");
        let what = lost.describe();
        lease.confirm(&what).await?;
        let work = create_index(store, lost.migration, lost.index);
        lease.while_held(&what, work).await??;
        report.recreated.push(lost.describe());
    }
    for migration in all {
        if applied.contains_key(&migration.id) {
            report.already_applied.push(migration.id);
            continue;
        }
        tracing::info!(migration = %migration.id, holder = lease.holder_id(), "applying migration");
        for step in &migration.steps {
            // No step runs on a lease not confirmed just before it: the last step or
            // record may have outlasted it (a majority slow to come back), and a step
            // shorter than a renewal's period is never renewed while it runs.
            lease.confirm(&migration.id).await?;
            let work = async {
                match step {
                    Step::CreateIndex(index) => create_index(store, &migration.id, index).await,
                    Step::Backfill(step) => backfill(store, &migration.id, step).await,
                    Step::DropIndex(index) => drop_index(store, index).await,
                }
            };
            lease.while_held(&migration.id, work).await??;
        }
        // Only a holder that still has the lease may say the work is done.
        lease.confirm(&migration.id).await?;
        if record(store, &migration).await? {
            report.applied.push(migration.id);
        } else {
            report.already_applied.push(migration.id);
        }
    }
    Ok(report)
}

/// Records `migration` as applied; `false` when another instance had already recorded it
/// with the same checksum (its work and ours were the same idempotent steps).
async fn record(store: &Store, migration: &Migration) -> Result<bool, MigrateError> {
    let inserted = store
        .collection(APPLIED)
        .insert_one(doc! {
            "_id": &migration.id,
            "checksum": &migration.checksum,
            "description": &migration.description,
            "appliedAt": DateTime::now(),
        })
        .await;
    match inserted {
        Ok(_) => Ok(true),
        Err(err) if duplicate_key_index(&err).is_some() => {
            let stored = applied_checksums(store).await?;
            match stored.get(&migration.id) {
                Some(checksum) if *checksum == migration.checksum => {
                    tracing::info!(migration = %migration.id, "migration already recorded by another instance");
                    Ok(false)
                }
                other => Err(MigrateError::ChecksumMismatch {
                    id: migration.id.clone(),
                    applied: other.cloned().unwrap_or_default(),
                    embedded: migration.checksum.clone(),
                }),
            }
        }
        Err(err) => Err(err.into()),
    }
}

fn split(all: Vec<Migration>, applied: &HashMap<String, String>) -> MigrationReport {
    let (done, todo): (Vec<_>, Vec<_>) = all.into_iter().partition(|m| applied.contains_key(&m.id));
    MigrationReport {
        applied: todo.into_iter().map(|m| m.id).collect(),
        already_applied: done.into_iter().map(|m| m.id).collect(),
        recreated: Vec::new(),
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
