//! The migration lease: one document in `_migrations_lock` naming its holder and when the
//! lease ends. One instance applies while the others wait; a holder that dies simply
//! lets its lease run out.
//!
//! A step may outlast any fixed lease (an index build or a backfill on a large
//! collection), so while a step runs a background task renews the lease every third of
//! its length. Renewing only ever extends a lease that is still ours and not yet over: a
//! holder that was paused past its lease (and perhaps taken over) learns it has lost it,
//! and stops instead of recording work another instance may be redoing. Every time on
//! the lease is the database's (`$$NOW`), never an instance's: a waiter whose clock runs
//! ahead must not take a live lease, nor a holder whose clock stepped back lose its own.
//! A renewal the
//! database failed to answer (an election, a dropped connection) says nothing of the
//! lease, which is ours for two thirds of its length yet: it is tried again until the
//! next renewal would be due, and only then given up.

use std::future::Future;
use std::time::Duration;

use mongodb::bson::{DateTime, doc};
use mongodb::options::ReturnDocument;
use tokio::sync::oneshot;

use super::MigrateError;
use crate::store::{Store, StoreError, duplicate_key_index};

const LOCK: &str = "_migrations_lock";
/// How often a waiting instance tries to take the lease.
pub(super) const POLL: Duration = Duration::from_millis(200);
/// How often a waiting instance says so, while the holder keeps it waiting.
const WAITING_LOG_EVERY: Duration = Duration::from_secs(30);
/// How long a start waits for a database that has never answered it: longer than an
/// election (about 12 s with MongoDB's defaults), so that an instance started while the
/// set elects waits for the new primary; short, so that a wrong address or a set not
/// started is told within seconds rather than after `patience`.
pub(super) const UNANSWERED_PATIENCE: Duration = Duration::from_secs(20);

/// A lease this instance holds; `release` it when done (or let it run out).
pub(super) struct Lease {
    store: Store,
    holder: String,
    length: Duration,
}

impl Lease {
    /// Waits until the lease is free or expired, and takes it; gives up once the holder
    /// has not renewed it for `patience` (a holder that keeps renewing is working, an
    /// index build hours long say, and is waited for).
    pub(super) async fn acquire(
        store: &Store,
        length: Duration,
        patience: Duration,
    ) -> Result<Self, MigrateError> {
        let lease = Self {
            store: store.clone(),
            holder: uuid::Uuid::new_v4().to_string(),
            length,
        };
        let started = tokio::time::Instant::now();
        let mut renewed_at = started;
        let mut logged_at = started;
        let mut seen = None;
        // Whether the database has answered this instance yet. Until it has, its
        // failures are waited for `UNANSWERED_PATIENCE` only: `patience` is for a holder
        // at work, and a database that answered before (an election while waiting).
        let mut answered = false;
        loop {
            // A command that fails (an election) says nothing of the holder: the next may.
            // While the database fails, its failure is what a wait that runs out reports,
            // rather than a holder that stopped renewing.
            let failing = match lease.try_take().await {
                Ok(true) => return Ok(lease),
                Ok(false) => {
                    answered = true;
                    None
                }
                // Unavailable: an election, or a database not there yet. Anything else
                // (refused credentials, say) is not waited through.
                Err(MigrateError::Store(err @ StoreError::Unavailable(_))) => Some(err),
                Err(other) => return Err(other),
            };
            if let Ok(held) = lease.holder().await {
                answered = true;
                if held.as_ref().map(|(_, end)| end) > seen.as_ref().map(|(_, end)| end) {
                    seen = held;
                    renewed_at = tokio::time::Instant::now();
                }
            }
            let out_of_patience = if answered {
                renewed_at.elapsed() > patience
            } else {
                started.elapsed() > UNANSWERED_PATIENCE.min(patience)
            };
            if out_of_patience {
                return Err(
                    failing.map_or(MigrateError::LockTimeout(patience), MigrateError::Store)
                );
            }
            if let Some(err) = &failing {
                tracing::warn!(error = %err, "cannot ask for the migration lease yet; trying again");
            }
            // A holder may renew for as long as its step takes, a stuck one too: say
            // whom this instance waits for, so that an operator can tell.
            if logged_at.elapsed() >= WAITING_LOG_EVERY {
                logged_at = tokio::time::Instant::now();
                tracing::info!(
                    holder = seen.as_ref().map(|(holder, _)| holder.as_str()),
                    waited_secs = started.elapsed().as_secs(),
                    "waiting for the migration lease, which another instance holds and renews"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The current holder, and when its lease ends as it last renewed it (`None`: no
    /// holder).
    async fn holder(&self) -> Result<Option<(String, DateTime)>, MigrateError> {
        let lock = self
            .store
            .collection(LOCK)
            .find_one(doc! { "_id": "lock" })
            .await?;
        Ok(lock.and_then(|lock| {
            let holder = lock.get_str("holder").ok()?.to_owned();
            let end = *lock.get_datetime("expiresAt").ok()?;
            Some((holder, end))
        }))
    }

    /// Takes the lease when it is free, expired or already ours, in one upsert whose
    /// pipeline leaves a live holder's lease as it is; says whether it is ours now. A
    /// duplicate key on `_id` means another instance created it at the same moment.
    async fn try_take(&self) -> Result<bool, MigrateError> {
        let ours = doc! { "_id": "lock", "holder": &self.holder, "expiresAt": self.end() };
        let takeable = doc! { "$or": [
            { "$eq": [{ "$type": "$holder" }, "missing"] },
            { "$eq": ["$holder", &self.holder] },
            { "$lt": ["$expiresAt", "$$NOW"] },
        ] };
        let result = self
            .store
            .collection(LOCK)
            .find_one_and_update(
                doc! { "_id": "lock" },
                vec![doc! { "$replaceWith": {
                    "$cond": { "if": takeable, "then": ours, "else": "$$ROOT" }
                } }],
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await;
        match result {
            Ok(lock) => Ok(lock.is_some_and(|lock| lock.get_str("holder") == Ok(&self.holder))),
            Err(err) if duplicate_key_index(&err).is_some() => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Extends the lease if it is still ours and not over; otherwise `LeaseLost` for
    /// `migration`. Called before each migration's first step and before it is
    /// recorded, and by the renewal task.
    pub(super) async fn confirm(&self, migration: &str) -> Result<(), MigrateError> {
        let renewed = self
            .store
            .collection(LOCK)
            .update_one(
                doc! {
                    "_id": "lock",
                    "holder": &self.holder,
                    "$expr": { "$gt": ["$expiresAt", "$$NOW"] },
                },
                vec![doc! { "$set": { "expiresAt": self.end() } }],
            )
            .await?;
        if renewed.matched_count == 1 {
            Ok(())
        } else {
            Err(MigrateError::LeaseLost {
                id: migration.to_owned(),
            })
        }
    }

    /// Runs `work` (a step of `migration`) while a background task renews the lease. When
    /// a renewal finds the lease lost, `work` is abandoned (steps are idempotent: the next
    /// holder redoes it) and the error is returned.
    pub(super) async fn while_held<F: Future>(
        &self,
        migration: &str,
        work: F,
    ) -> Result<F::Output, MigrateError> {
        let (lost_tx, lost_rx) = oneshot::channel();
        let renewer = Lease {
            store: self.store.clone(),
            holder: self.holder.clone(),
            length: self.length,
        };
        let migration_id = migration.to_owned();
        let renewal = tokio::spawn(async move {
            loop {
                tokio::time::sleep(renewer.length / 3).await;
                if let Err(err) = renewer.renew(&migration_id).await {
                    let _ = lost_tx.send(err);
                    return;
                }
            }
        });
        // Stops the renewal however this function ends (even when its caller drops it).
        let _stop = AbortOnDrop(renewal);
        tokio::select! {
            output = work => Ok(output),
            Ok(err) = lost_rx => Err(err),
        }
    }

    /// One renewal, a third of the lease after the last: `confirm`, tried again while a
    /// failure is the database's (not a lease found lost) and another third has not
    /// passed, so that the lease is still ours whenever it is renewed. A renewal the
    /// database holds (a majority that does not come back) is given up at the same
    /// point: past it the lease may have run out and been taken, and an answer that
    /// comes later says nothing of the time between.
    async fn renew(&self, migration: &str) -> Result<(), MigrateError> {
        let due = tokio::time::Instant::now() + self.length / 3;
        loop {
            match tokio::time::timeout_at(due, self.confirm(migration)).await {
                Ok(Err(MigrateError::Store(err))) if tokio::time::Instant::now() + POLL < due => {
                    tracing::warn!(migration, error = %err, "cannot renew the migration lease yet; trying again");
                    tokio::time::sleep(POLL).await;
                }
                Ok(other) => return other,
                Err(_) => {
                    tracing::warn!(
                        migration,
                        "the database held the migration lease's renewal past the lease; giving it up"
                    );
                    return Err(MigrateError::LeaseLost {
                        id: migration.to_owned(),
                    });
                }
            }
        }
    }

    /// This holder's id, as the lease names it (and a waiter's log).
    pub(super) fn holder_id(&self) -> &str {
        &self.holder
    }

    /// Gives the lease up at once; if this fails the lease simply runs out.
    pub(super) async fn release(self) {
        let _ = self
            .store
            .collection(LOCK)
            .delete_one(doc! { "_id": "lock", "holder": &self.holder })
            .await;
    }

    /// The end of a lease taken or renewed now, by the database's clock.
    fn end(&self) -> mongodb::bson::Document {
        let length = i64::try_from(self.length.as_millis()).unwrap_or(i64::MAX);
        doc! { "$add": ["$$NOW", length] }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
