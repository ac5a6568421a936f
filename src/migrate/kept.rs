//! The indexes the applied migrations leave behind, and which of them the database lacks.
//! `_migrations` says what was done, not what is still there: a restore that copied the
//! documents but not their indexes, or an index dropped by hand, leaves every migration
//! recorded and the unique keys that make issuance exactly-once unguarded. So a run builds
//! the missing ones again, a start that may not change the schema refuses, and `verify`
//! reports them.

use std::collections::HashMap;

use super::{IndexStep, Migration, Step};
use crate::store::{Store, StoreError};

/// An index an applied migration built and no applied migration dropped since, with the
/// id of the migration that built it.
pub(super) struct KeptIndex<'a> {
    pub migration: &'a str,
    pub index: &'a IndexStep,
}

impl KeptIndex<'_> {
    /// `collection.name (migration)`: how reports and errors name it.
    pub fn describe(&self) -> String {
        format!(
            "{}.{} ({})",
            self.index.collection, self.index.name, self.migration
        )
    }
}

/// Of the indexes `all`'s migrations recorded in `applied` leave, in the order they were
/// built, those the database has no index of that name for on their collection.
pub(super) async fn missing<'a>(
    store: &Store,
    all: &'a [Migration],
    applied: &HashMap<String, String>,
) -> Result<Vec<KeptIndex<'a>>, StoreError> {
    let mut kept: Vec<KeptIndex<'a>> = Vec::new();
    for migration in all.iter().filter(|m| applied.contains_key(&m.id)) {
        for step in &migration.steps {
            match step {
                Step::CreateIndex(index) => kept.push(KeptIndex {
                    migration: &migration.id,
                    index,
                }),
                Step::DropIndex(dropped) => kept.retain(|k| {
                    k.index.collection != dropped.collection || k.index.name != dropped.name
                }),
                Step::Backfill(_) => {}
            }
        }
    }
    let mut names: HashMap<&str, Vec<String>> = HashMap::new();
    let mut missing = Vec::new();
    for kept in kept {
        let collection = kept.index.collection.as_str();
        if !names.contains_key(collection) {
            names.insert(collection, index_names(store, collection).await?);
        }
        if !names[collection].contains(&kept.index.name) {
            missing.push(kept);
        }
    }
    Ok(missing)
}

/// The names of `collection`'s indexes; none when there is no such collection.
async fn index_names(store: &Store, collection: &str) -> Result<Vec<String>, StoreError> {
    /// NamespaceNotFound: no collection, so no index either.
    const NO_COLLECTION: i32 = 26;
    match store.collection(collection).list_index_names().await {
        Ok(names) => Ok(names),
        Err(err) if matches!(err.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == NO_COLLECTION) => {
            Ok(Vec::new())
        }
        Err(err) => Err(err.into()),
    }
}
