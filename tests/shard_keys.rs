//! The schema stays shardable: on a sharded MongoDB cluster a unique index must start with
//! its collection's shard key, and tokenmint's exactly-once guarantee IS its unique
//! indexes. This test parses every `migrations/*.json` and checks each `createIndex` step
//! against the shard keys declared below, which mirror `docs/scaling.md` (the test also
//! checks that the document names the same keys, so the two cannot drift apart).
//!
//! No database: the rule is checked on the migration files themselves, so a migration that
//! would make a sharded deployment refuse (or silently not enforce) a unique index fails
//! here, before it is ever applied. The writes themselves are checked against the same
//! table by every test app (`tokenmint_test_support::shard_keys`).

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// The database name the documented `sh.shardCollection` commands use (`mongo.database`'s
/// default).
const DATABASE: &str = "tokenmint";

/// Every sharded collection and its shard key (ranged, each field ascending, in this
/// order), shared with the check every test app makes of its writes.
const SHARDED: &[(&str, &[&str])] = tokenmint_test_support::shard_keys::SHARD_KEYS;

/// Collections that stay unsharded (on the database's primary shard): no constraint.
const UNSHARDED: &[&str] = &["_migrations", "_migrations_lock"];

/// What this test reads of a migration file; everything else is ignored.
#[derive(Deserialize)]
struct MigrationFile {
    steps: Vec<Step>,
}

/// One step; only `createIndex` matters here (a `backfill` creates no index).
#[derive(Deserialize)]
struct Step {
    #[serde(rename = "createIndex")]
    create_index: Option<IndexStep>,
}

#[derive(Deserialize)]
struct IndexStep {
    collection: String,
    name: String,
    keys: IndexKeys,
    #[serde(default)]
    unique: bool,
}

/// An index's `keys` in the file's order, which is the index's order. Read by hand rather
/// than through `serde_json::Value`, whose map may sort its keys.
struct IndexKeys(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for IndexKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;

        impl<'de> Visitor<'de> for InOrder {
            type Value = IndexKeys;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of index fields")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IndexKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some(field) = map.next_key::<String>()? {
                    keys.push((field, map.next_value::<Value>()?));
                }
                Ok(IndexKeys(keys))
            }
        }

        deserializer.deserialize_map(InOrder)
    }
}

impl fmt::Display for IndexKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        write!(f, "{{ {} }}", fields.join(", "))
    }
}

fn shard_key(collection: &str) -> Option<&'static [&'static str]> {
    SHARDED
        .iter()
        .find(|(name, _)| *name == collection)
        .map(|(_, key)| *key)
}

/// Whether `keys` starts with every field of `shard_key`, in order, each ascending (1).
fn starts_with_shard_key(keys: &IndexKeys, shard_key: &[&str]) -> bool {
    keys.0.len() >= shard_key.len()
        && keys
            .0
            .iter()
            .zip(shard_key)
            .all(|((field, direction), expected)| {
                field == expected && direction.as_i64() == Some(1)
            })
}

/// What one migration file's indexes mean for sharding.
#[derive(Debug, Default)]
struct Checked {
    /// Collections the file creates indexes on.
    collections: Vec<String>,
    /// Unique indexes checked against a shard key.
    unique_indexes: usize,
    /// Everything that breaks the rule, described for the failure message.
    violations: Vec<String>,
}

/// Checks every `createIndex` step of the migration `file` (its text `text`).
fn check(file: &str, text: &str) -> Checked {
    let mut checked = Checked::default();
    let migration: MigrationFile = match serde_json::from_str(text) {
        Ok(migration) => migration,
        Err(err) => {
            checked
                .violations
                .push(format!("{file}: cannot parse: {err}"));
            return checked;
        }
    };
    for index in migration.steps.into_iter().filter_map(|s| s.create_index) {
        checked.collections.push(index.collection.clone());
        if UNSHARDED.contains(&index.collection.as_str()) {
            continue;
        }
        let Some(key) = shard_key(&index.collection) else {
            checked.violations.push(format!(
                "{file}: index {} is on `{}`, which has no declared shard key: decide one in \
                 docs/scaling.md and add it to SHARDED (or UNSHARDED) in tests/shard_keys.rs",
                index.name, index.collection
            ));
            continue;
        };
        if !index.unique {
            continue;
        }
        checked.unique_indexes += 1;
        if !starts_with_shard_key(&index.keys, key) {
            checked.violations.push(format!(
                "{file}: unique index {} on `{}` has keys {}, which do not start with the \
                 collection's shard key {{ {} }} (each field ascending): a sharded cluster \
                 cannot enforce it",
                index.name,
                index.collection,
                index.keys,
                key.iter()
                    .map(|f| format!("{f}: 1"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    checked
}

/// The `mongosh` command that shards `collection` on `key`, exactly as docs/scaling.md
/// writes it.
fn shard_collection_command(collection: &str, key: &[&str]) -> String {
    let fields: Vec<String> = key.iter().map(|f| format!("\"{f}\": 1")).collect();
    format!(
        "sh.shardCollection(\"{DATABASE}.{collection}\", {{ {} }})",
        fields.join(", ")
    )
}

fn repository_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()))
}

#[test]
fn every_unique_index_starts_with_its_collections_shard_key() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("migrations/ exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no migrations found in {}",
        dir.display()
    );

    let mut collections = Vec::new();
    let mut unique_indexes = 0;
    let mut violations = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let text = std::fs::read_to_string(path).expect("readable migration");
        let checked = check(&name, &text);
        collections.extend(checked.collections);
        unique_indexes += checked.unique_indexes;
        violations.extend(checked.violations);
    }
    assert!(
        violations.is_empty(),
        "migrations that a sharded cluster would refuse:\n{}",
        violations.join("\n")
    );
    // Not vacuous: the files were understood, and the unique indexes were found.
    assert!(unique_indexes > 0, "no unique index found in migrations/");
    // No stale declaration: every declared sharded collection is one the schema indexes.
    for (collection, _) in SHARDED {
        assert!(
            collections.iter().any(|c| c == collection),
            "`{collection}` is declared sharded but no migration indexes it"
        );
    }
}

#[test]
fn docs_scaling_md_declares_the_same_shard_keys() {
    let doc = repository_file("docs/scaling.md");
    for (collection, key) in SHARDED {
        let command = shard_collection_command(collection, key);
        assert!(
            doc.contains(&command),
            "docs/scaling.md does not contain `{command}`: the shard key of `{collection}` \
             there and in tests/shard_keys.rs differ"
        );
    }
    for collection in UNSHARDED {
        assert!(
            doc.contains(&format!("`{collection}`")),
            "docs/scaling.md does not mention the unsharded collection `{collection}`"
        );
    }
}

/// The check itself, on synthetic migrations: it must refuse what a sharded cluster
/// refuses, and accept what the real migrations do.
#[test]
fn the_check_refuses_a_unique_index_not_prefixed_by_the_shard_key() {
    let migration = |collection: &str, keys: &str, unique: bool| {
        format!(
            r#"{{"description": "synthetic", "steps": [
                {{"backfill": {{"collection": "tokens", "filter": {{}}, "set": {{"a": 1}}, "batchSize": 1}}}},
                {{"createIndex": {{"collection": "{collection}", "name": "synthetic",
                    "keys": {keys}, "unique": {unique}}}}}
            ]}}"#
        )
    };
    let refused = [
        // The shard key's fields, in another order.
        (
            "issuances",
            r#"{"accountId": 1, "provider": 1, "paymentIntentId": 1}"#,
        ),
        // Only part of the shard key.
        ("payments", r#"{"provider": 1, "accountId": 1}"#),
        // The payment key without the `origin.` prefix tokens store it under.
        (
            "tokens",
            r#"{"provider": 1, "accountId": 1, "paymentIntentId": 1, "tokenIndex": 1}"#,
        ),
        // A field before the shard key.
        (
            "webhook_events",
            r#"{"receivedAt": 1, "provider": 1, "eventId": 1}"#,
        ),
        // Not ranged ascending.
        ("webhook_events", r#"{"provider": 1, "eventId": "hashed"}"#),
        ("webhook_events", r#"{"provider": -1, "eventId": 1}"#),
    ];
    for (collection, keys) in refused {
        let checked = check("synthetic.json", &migration(collection, keys, true));
        assert_eq!(checked.unique_indexes, 1, "{collection} {keys}");
        assert_eq!(
            checked.violations.len(),
            1,
            "{collection} {keys} was accepted"
        );
    }

    let accepted = [
        (
            "tokens",
            r#"{"origin.provider": 1, "origin.accountId": 1, "origin.paymentIntentId": 1, "tokenIndex": 1}"#,
            true,
        ),
        (
            "issuances",
            r#"{"provider": 1, "accountId": 1, "paymentIntentId": 1}"#,
            true,
        ),
        // Not unique: any keys will do.
        ("tokens", r#"{"owner": 1, "_id": 1}"#, false),
        // Unsharded: no constraint.
        ("_migrations", r#"{"appliedAt": 1}"#, true),
    ];
    for (collection, keys, unique) in accepted {
        let checked = check("synthetic.json", &migration(collection, keys, unique));
        assert!(
            checked.violations.is_empty(),
            "{collection} {keys}: {:?}",
            checked.violations
        );
    }

    // A collection without a sharding decision is refused, unique index or not.
    for unique in [true, false] {
        let checked = check(
            "synthetic.json",
            &migration("refunds", r#"{"paymentIntentId": 1}"#, unique),
        );
        assert_eq!(
            checked.violations.len(),
            1,
            "undeclared collection accepted"
        );
    }
    // A file that is not a migration is reported, not skipped.
    assert_eq!(check("broken.json", "{").violations.len(), 1);
}
