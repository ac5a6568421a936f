//! The indexes the applied migrations leave behind, and which of them the database does
//! not have as they were built. `_migrations` says what was done, not what is still
//! there: a restore that copied the documents but not their indexes, or an index dropped
//! by hand, leaves every migration recorded and the unique keys that make issuance
//! exactly-once unguarded. So a run builds the missing ones again, a start that may not
//! change the schema refuses, and `verify` reports them.

use std::collections::HashMap;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Bson, Document};

use super::{IndexStep, Migration, Step};
use crate::store::{Store, StoreError, is_namespace_not_found};

/// An index an applied migration built that the database does not have as built.
pub(super) struct LostIndex<'a> {
    /// The id of the migration that built it.
    pub migration: &'a str,
    pub index: &'a IndexStep,
    pub how: Lost,
}

/// How an index is not there as its migration built it.
pub(super) enum Lost {
    /// No index of its name: a run builds it again.
    Missing,
    /// One of its name with other keys or options (made by hand): building it again
    /// would fail on the name, so an operator drops it first.
    Differs,
    /// Its keys are indexed under another name (made by hand): the code tells unique
    /// indexes apart by name, and building it again would fail on the keys, so an
    /// operator drops that one first.
    Renamed(String),
}

impl LostIndex<'_> {
    /// `collection.name (migration)`: how reports and errors name it.
    pub fn describe(&self) -> String {
        format!(
            "{}.{} ({})",
            self.index.collection, self.index.name, self.migration
        )
    }

    /// `describe`, and for one a run cannot build again, what the operator does.
    pub fn finding(&self) -> String {
        let what = match &self.how {
            Lost::Missing => return self.describe(),
            Lost::Differs => "is not as its migration built it".to_owned(),
            Lost::Renamed(other) => format!("has its keys indexed as `{other}`"),
        };
        format!(
            "{} {what}: drop that index, then run `tokenmint migrate`",
            self.describe()
        )
    }

    /// Whether a run builds it again (one of another shape must be dropped first).
    pub fn rebuildable(&self) -> bool {
        matches!(self.how, Lost::Missing)
    }
}

/// The indexes `all`'s migrations recorded in `applied` built, that no migration of `all`
/// drops after them (applied, or pending: a run about to drop an index does not build
/// it first), and that the database does not have as built, in the order they were
/// built. None when `applied` holds a migration this binary does not know: a newer
/// version migrated this database, and what it dropped or changed is its own to say
/// (an older instance beside it, or a rollback, must not build back what it dropped).
pub(super) async fn lost<'a>(
    store: &Store,
    all: &'a [Migration],
    applied: &HashMap<String, String>,
) -> Result<Vec<LostIndex<'a>>, StoreError> {
    if let Some(unknown) = applied.keys().find(|id| !all.iter().any(|m| &m.id == *id)) {
        tracing::warn!(migration = %unknown, "a newer version migrated this database: its indexes are not checked");
        return Ok(Vec::new());
    }
    let mut kept: Vec<(&'a str, &'a IndexStep)> = Vec::new();
    for migration in all {
        for step in &migration.steps {
            match step {
                Step::CreateIndex(index) if applied.contains_key(&migration.id) => {
                    kept.push((&migration.id, index));
                }
                Step::DropIndex(dropped) => kept.retain(|(_, index)| {
                    index.collection != dropped.collection || index.name != dropped.name
                }),
                _ => {}
            }
        }
    }
    let mut existing: HashMap<&str, Vec<IndexModel>> = HashMap::new();
    let mut lost = Vec::new();
    for (migration, index) in kept {
        let collection = index.collection.as_str();
        if !existing.contains_key(collection) {
            existing.insert(collection, indexes(store, collection).await?);
        }
        let how = match existing[collection]
            .iter()
            .find(|m| name(m) == Some(&index.name))
        {
            Some(model) if built_as(model, index) => continue,
            Some(_) => Lost::Differs,
            None => match existing[collection]
                .iter()
                .find(|m| same_keys(&m.keys, &index.keys))
            {
                Some(other) => Lost::Renamed(name(other).cloned().unwrap_or_default()),
                None => Lost::Missing,
            },
        };
        lost.push(LostIndex {
            migration,
            index,
            how,
        });
    }
    Ok(lost)
}

/// `collection`'s indexes; none when there is no such collection.
async fn indexes(store: &Store, collection: &str) -> Result<Vec<IndexModel>, StoreError> {
    match store.collection(collection).list_indexes().await {
        Ok(indexes) => Ok(indexes.try_collect().await?),
        Err(err) if is_namespace_not_found(&err) => Ok(Vec::new()),
        Err(err) => Err(err.into()),
    }
}

fn name(model: &IndexModel) -> Option<&String> {
    model.options.as_ref()?.name.as_ref()
}

/// Whether `model` is the index `step` builds: its keys, in order, and its options.
fn built_as(model: &IndexModel, step: &IndexStep) -> bool {
    let options = model.options.as_ref();
    same_keys(&model.keys, &step.keys)
        && options.and_then(|o| o.unique).unwrap_or(false) == step.unique
        && options.and_then(|o| o.partial_filter_expression.as_ref())
            == step.partial_filter_expression.as_ref()
        && options
            .and_then(|o| o.expire_after)
            .map(|after| after.as_secs())
            == step.expire_after_seconds
}

/// The same fields in the same order, each in the same direction: a key's direction may
/// be stored as another number type (`1` and `1.0` by another client).
fn same_keys(a: &Document, b: &Document) -> bool {
    let number = |value: &Bson| match value {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|((field_a, a), (field_b, b))| {
            field_a == field_b
                && match (number(a), number(b)) {
                    (Some(a), Some(b)) => a == b,
                    _ => a == b,
                }
        })
}
