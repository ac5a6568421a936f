//! The shard keys, and a check of every write the application sends against them.
//!
//! On a sharded cluster MongoDB 6.0 refuses a `findAndModify` whose query has no equality
//! on the full shard key, and a single-document `update` or `delete` that names neither
//! the full shard key nor `_id` (an upsert must name the shard key). Every test app
//! records the writes it sends through the driver's command events
//! ([`ShardKeyCheck::observer`]) and fails its test when one of them would be refused:
//! the whole API suite's flows are the check.

use std::sync::{Arc, Mutex};

use mongodb::bson::{Bson, Document};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;

/// Every sharded collection and its shard key: ranged, each field ascending, in this
/// order. Mirrors the table and the commands in `docs/scaling.md` (`tests/shard_keys.rs`
/// checks both, and the migrations' unique indexes, against it).
pub const SHARD_KEYS: &[(&str, &[&str])] = &[
    (
        "tokens",
        &[
            "origin.provider",
            "origin.accountId",
            "origin.paymentIntentId",
        ],
    ),
    ("issuances", &["provider", "accountId", "paymentIntentId"]),
    ("payments", &["provider", "accountId", "paymentIntentId"]),
    ("webhook_events", &["provider", "eventId"]),
    ("idempotency_keys", &["keyId", "key"]),
    ("redemptions", &["owner", "reference"]),
];

/// The writes an app sent that a sharded cluster would refuse, as they are found.
#[derive(Clone, Default)]
pub struct ShardKeyCheck {
    refused: Arc<Mutex<Vec<String>>>,
}

impl ShardKeyCheck {
    /// The command observer to build the app with.
    pub fn observer(&self) -> EventHandler<CommandEvent> {
        let refused = self.refused.clone();
        EventHandler::callback(move |event| {
            if let CommandEvent::Started(started) = event {
                let found = refusals(&started.command_name, &started.command);
                if !found.is_empty() {
                    refused.lock().unwrap().extend(found);
                }
            }
        })
    }

    /// What was found so far.
    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }
}

/// Why a sharded cluster would refuse `command` (`name` is its command name): one line
/// per single-document write that names too little.
pub fn refusals(name: &str, command: &Document) -> Vec<String> {
    let Some(key) = command
        .get_str(name)
        .ok()
        .and_then(|collection| shard_key(collection).map(|key| (collection, key)))
    else {
        return Vec::new();
    };
    let (collection, key) = key;
    let mut found = Vec::new();
    let mut check = |what: &str, filter: &Document, id_will_do: bool| {
        let names_key = key.iter().all(|field| equality(filter, field));
        let names_id = id_will_do && equality(filter, "_id");
        if !(names_key || names_id) {
            found.push(format!(
                "{what} on {collection} names no shard key {key:?}: {filter}"
            ));
        }
    };
    match name {
        "findAndModify" => {
            let query = command.get_document("query").cloned().unwrap_or_default();
            check("findAndModify", &query, false);
        }
        "update" => {
            for statement in documents(command, "updates") {
                let multi = statement.get_bool("multi").unwrap_or(false);
                let upsert = statement.get_bool("upsert").unwrap_or(false);
                if !multi {
                    let filter = statement.get_document("q").cloned().unwrap_or_default();
                    check(
                        if upsert { "upsert" } else { "updateOne" },
                        &filter,
                        !upsert,
                    );
                }
            }
        }
        "delete" => {
            for statement in documents(command, "deletes") {
                if statement.get_i32("limit").unwrap_or(0) == 1 {
                    let filter = statement.get_document("q").cloned().unwrap_or_default();
                    check("deleteOne", &filter, true);
                }
            }
        }
        _ => {}
    }
    found
}

fn shard_key(collection: &str) -> Option<&'static [&'static str]> {
    SHARD_KEYS
        .iter()
        .find(|(name, _)| *name == collection)
        .map(|(_, key)| *key)
}

/// The statements of a write command: in its body, or (as the driver sends large ones) in
/// an OP_MSG document sequence, which the started event folds into the body too.
fn documents<'a>(command: &'a Document, field: &str) -> impl Iterator<Item = &'a Document> {
    command
        .get_array(field)
        .into_iter()
        .flatten()
        .filter_map(Bson::as_document)
}

/// Whether `filter` pins `field` to one value: `field: v` or `field: {$eq: v}`, at the
/// top or inside a top-level `$and`.
fn equality(filter: &Document, field: &str) -> bool {
    let pinned = match filter.get(field) {
        Some(Bson::Document(condition)) => {
            condition.keys().all(|k| !k.starts_with('$')) || condition.contains_key("$eq")
        }
        Some(Bson::Array(_)) | None => false,
        Some(_) => true,
    };
    pinned
        || filter
            .get_array("$and")
            .into_iter()
            .flatten()
            .filter_map(Bson::as_document)
            .any(|clause| equality(clause, field))
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn single_document_writes_must_name_the_shard_key() {
        let key = doc! { "provider": "stripe", "accountId": "a", "paymentIntentId": "pi" };
        let by_key = doc! { "findAndModify": "payments", "query": key.clone() };
        assert!(refusals("findAndModify", &by_key).is_empty());
        let by_id = doc! { "findAndModify": "payments", "query": { "_id": 1 } };
        assert_eq!(
            refusals("findAndModify", &by_id).len(),
            1,
            "an _id is not enough"
        );
        let ranged = doc! { "findAndModify": "payments", "query": {
        "provider": "stripe", "accountId": "a", "paymentIntentId": { "$in": ["pi"] } } };
        assert_eq!(refusals("findAndModify", &ranged).len(), 1);

        let update = |q: Document, multi: bool, upsert: bool| {
            doc! { "update": "issuances", "updates": [
            { "q": q, "u": {}, "multi": multi, "upsert": upsert } ] }
        };
        assert!(refusals("update", &update(doc! { "_id": 1 }, false, false)).is_empty());
        assert_eq!(
            refusals("update", &update(doc! { "_id": 1 }, false, true)).len(),
            1
        );
        assert!(refusals("update", &update(doc! { "status": "x" }, true, false)).is_empty());
        assert_eq!(
            refusals("update", &update(doc! { "status": "x" }, false, false)).len(),
            1
        );
        assert!(refusals("update", &update(doc! { "$and": [key] }, false, true)).is_empty());

        let unsharded = doc! { "findAndModify": "_migrations_lock", "query": {} };
        assert!(refusals("findAndModify", &unsharded).is_empty());
    }
}
