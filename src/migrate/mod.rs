//! Schema migrations: ordered JSON files in `migrations/`, embedded in the
//! binary, applied once each and recorded in `_migrations` with the checksum of the file.
//!
//! A migration is a list of steps: `createIndex` (unique ones are preceded by a duplicate
//! check that reports offending groups instead of a raw server error) and `backfill`
//! (an `$set` applied in batches to documents matching a filter, so a large collection
//! is never updated by one long-running command), and `dropIndex` (an index a later one
//! made redundant: every write to its collection pays for each index it keeps).

mod duplicates;
mod kept;
mod lease;
mod runner;
mod steps;

use mongodb::bson::Document;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use duplicates::{DuplicateGroup, DuplicateReport, find_duplicates};
pub use runner::{
    LeaseTiming, MigrateError, MigrationReport, apply, missing_indexes, pending, run,
    verify_applied,
};

/// The migration files, in order. A test checks this list against `migrations/`.
const FILES: &[(&str, &str)] = &[
    (
        "0001_tokens_unique_payment_index",
        include_str!("../../migrations/0001_tokens_unique_payment_index.json"),
    ),
    (
        "0002_issuances_unique_payment_index",
        include_str!("../../migrations/0002_issuances_unique_payment_index.json"),
    ),
    (
        "0003_tokens_backfill_version",
        include_str!("../../migrations/0003_tokens_backfill_version.json"),
    ),
    (
        "0004_tokens_owner_listing_index",
        include_str!("../../migrations/0004_tokens_owner_listing_index.json"),
    ),
    (
        "0005_webhook_events_unique_event",
        include_str!("../../migrations/0005_webhook_events_unique_event.json"),
    ),
    (
        "0006_payments_unique_payment",
        include_str!("../../migrations/0006_payments_unique_payment.json"),
    ),
    (
        "0007_issuances_unfinished_index",
        include_str!("../../migrations/0007_issuances_unfinished_index.json"),
    ),
    (
        "0008_issuances_pending_expiry",
        include_str!("../../migrations/0008_issuances_pending_expiry.json"),
    ),
    (
        "0009_payments_recent_changes",
        include_str!("../../migrations/0009_payments_recent_changes.json"),
    ),
    (
        "0010_idempotency_keys_indexes",
        include_str!("../../migrations/0010_idempotency_keys_indexes.json"),
    ),
    (
        "0011_tokens_owner_balance_index",
        include_str!("../../migrations/0011_tokens_owner_balance_index.json"),
    ),
    (
        "0012_redemptions_unique_reference",
        include_str!("../../migrations/0012_redemptions_unique_reference.json"),
    ),
    (
        "0013_tokens_account_listing_index",
        include_str!("../../migrations/0013_tokens_account_listing_index.json"),
    ),
    (
        "0014_tokens_spending_order_index",
        include_str!("../../migrations/0014_tokens_spending_order_index.json"),
    ),
    (
        "0015_tokens_drop_owner_balance_index",
        include_str!("../../migrations/0015_tokens_drop_owner_balance_index.json"),
    ),
];

/// One parsed migration file.
#[derive(Debug, Clone)]
pub struct Migration {
    pub id: String,
    pub checksum: String,
    pub description: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrationFile {
    description: String,
    steps: Vec<Step>,
}

/// One step of a migration.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    CreateIndex(IndexStep),
    Backfill(BackfillStep),
    DropIndex(DropIndexStep),
}

/// Creates an index (idempotent: an identical existing index is fine).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexStep {
    pub collection: String,
    pub name: String,
    /// A BSON document so that key order — which matters for an index — is kept.
    pub keys: Document,
    #[serde(default)]
    pub unique: bool,
    pub partial_filter_expression: Option<Document>,
    /// A TTL index: documents expire this many seconds after the date in its key.
    pub expire_after_seconds: Option<u64>,
}

/// Drops an index by name (idempotent: one already gone is fine).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DropIndexStep {
    pub collection: String,
    pub name: String,
}

/// Sets fields on matching documents, `batch_size` documents at a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackfillStep {
    pub collection: String,
    pub filter: Document,
    pub set: Document,
    pub batch_size: u32,
}

/// Every embedded migration, parsed, in order.
pub fn migrations() -> Result<Vec<Migration>, MigrateError> {
    FILES.iter().map(|(id, text)| parse(id, text)).collect()
}

/// Parses one migration file; the checksum covers its exact bytes.
pub fn parse(id: &str, text: &str) -> Result<Migration, MigrateError> {
    let file: MigrationFile =
        serde_json::from_str(text).map_err(|e| MigrateError::InvalidFile {
            id: id.to_owned(),
            message: e.to_string(),
        })?;
    Ok(Migration {
        id: id.to_owned(),
        checksum: hex::encode(Sha256::digest(text.as_bytes())),
        description: file.description,
        steps: file.steps,
    })
}

/// The unique indexes the migrations create: what `tokenmint duplicates` checks.
pub fn unique_indexes() -> Result<Vec<IndexStep>, MigrateError> {
    Ok(migrations()?
        .into_iter()
        .flat_map(|m| m.steps)
        .filter_map(|step| match step {
            Step::CreateIndex(index) if index.unique => Some(index),
            _ => None,
        })
        .collect())
}

/// The keys of the unique token index (`uniq_token_payment_index`, the first migration's),
/// in their order: the payment key first, so that its prefix serves every read of one
/// payment's tokens. Key order is part of an index and JSON objects have none of their
/// own, so this is what the migration's file must keep when parsed (a unit test) and what
/// the index the database builds from it must have (the migration tests).
pub const TOKEN_PAYMENT_INDEX_KEYS: [&str; 4] = [
    "origin.provider",
    "origin.accountId",
    "origin.paymentIntentId",
    "tokenIndex",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_the_folder_is_embedded_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .trim_end_matches(".json")
                    .to_owned()
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = FILES.iter().map(|(id, _)| (*id).to_owned()).collect();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn all_migrations_parse_and_keep_key_order() {
        let all = migrations().unwrap();
        let Step::CreateIndex(index) = &all[0].steps[0] else {
            panic!("first step is an index")
        };
        let keys: Vec<&String> = index.keys.keys().collect();
        assert_eq!(keys, TOKEN_PAYMENT_INDEX_KEYS);
    }

    #[test]
    fn checksum_changes_with_the_text() {
        let a = parse("x", r#"{"description":"a","steps":[]}"#).unwrap();
        let b = parse("x", r#"{"description":"b","steps":[]}"#).unwrap();
        assert_ne!(a.checksum, b.checksum);
    }
}
