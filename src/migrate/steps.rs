//! What each kind of step does. Each is idempotent, so a holder that dies (or loses its
//! lease) mid-step leaves nothing a successor cannot redo.

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::IndexOptions;

use super::{BackfillStep, DropIndexStep, IndexStep, MigrateError, find_duplicates};
use crate::store::{Store, duplicate_key_index};

/// Builds the index, after a duplicate check when it is unique.
pub(super) async fn create_index(
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

/// Drops the index; one that is already gone (a successor dropped it, or it was never
/// built on this deployment) is done.
pub(super) async fn drop_index(store: &Store, index: &DropIndexStep) -> Result<(), MigrateError> {
    /// IndexNotFound, and NamespaceNotFound (no collection, so no index either).
    const ALREADY_GONE: [i32; 2] = [27, 26];
    match store
        .collection(&index.collection)
        .drop_index(&index.name)
        .await
    {
        Ok(()) => Ok(()),
        Err(err) if matches!(err.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if ALREADY_GONE.contains(&c.code)) => {
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

/// Index builds report duplicates as a command error with code 11000.
fn is_duplicate_build_error(err: &mongodb::error::Error) -> bool {
    matches!(err.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 11000)
}

/// Sets `step.set` on every document matching `step.filter`, `batch_size` at a time,
/// until a read finds none left. A batch that changes nothing is not the end: concurrent
/// writers may have changed (or versioned) exactly the documents it read, while others
/// still match, and new ones may have been inserted meanwhile.
pub(super) async fn backfill(
    store: &Store,
    migration: &str,
    step: &BackfillStep,
) -> Result<(), MigrateError> {
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
        // Documents that still match yet already hold `set`: this backfill would read
        // them again forever. A file error, not something a retry fixes.
        if result.matched_count > 0 && result.modified_count == 0 {
            return Err(MigrateError::InvalidFile {
                id: migration.to_owned(),
                message: format!(
                    "backfill on {}: documents matching the filter already hold the values set, so the filter never runs dry",
                    step.collection
                ),
            });
        }
        total += result.modified_count;
    }
    if total > 0 {
        tracing::info!(collection = %step.collection, documents = total, "backfill done");
    }
    Ok(())
}
