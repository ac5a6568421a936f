//! The migrator against a real mongod, each test on a fresh database: [`applying`]
//! (once, checksums of applied files, concurrent starts, dry runs), [`data`] (duplicate
//! reports before a unique index, batched backfill) and the [`cli`] commands `migrate` and
//! `duplicates`. The migrator under load and with a lease taken over is in
//! `migrations_load`.

mod applying;
mod cli;
mod data;

use futures::TryStreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Collection, IndexModel};
use tokenmint::migrate::migrations;
use tokenmint::store::Store;

use crate::helpers::{ScratchDatabase, connect_store, documents_by_id, mongo_uri};

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

/// A fresh database on the test mongod, dropped when the test ends (even when it panics),
/// with the reads the migration tests make. Nothing is applied to it until a test does.
pub(crate) struct FreshDb(ScratchDatabase);

impl FreshDb {
    pub(crate) async fn new() -> Self {
        Self(ScratchDatabase::create("tokenmint_mig").await)
    }

    pub(crate) fn name(&self) -> &str {
        self.0.name()
    }

    /// A store of its own on this database, as another instance would connect.
    pub(crate) async fn store(&self) -> Store {
        connect_store(&mongo_uri(), self.name()).await
    }

    pub(crate) fn collection(&self, name: &str) -> Collection<Document> {
        self.0.store().database().collection(name)
    }

    pub(crate) async fn count(&self, collection: &str, filter: Document) -> u64 {
        self.collection(collection)
            .count_documents(filter)
            .await
            .unwrap()
    }

    /// The `_migrations` records, in `_id` (migration id) order.
    pub(crate) async fn applied(&self) -> Vec<Document> {
        documents_by_id(self.0.store().database(), "_migrations").await
    }

    /// Names of the collections that exist.
    async fn collections(&self) -> Vec<String> {
        let mut names = self
            .0
            .store()
            .database()
            .list_collection_names()
            .await
            .unwrap();
        names.sort();
        names
    }

    /// Every index on `collection`, as the server lists it.
    async fn index_models(&self, collection: &str) -> Vec<IndexModel> {
        self.collection(collection)
            .list_indexes()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }

    /// (name, unique) of every index on `collection`.
    pub(crate) async fn indexes(&self, collection: &str) -> Vec<(String, bool)> {
        self.index_models(collection)
            .await
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
