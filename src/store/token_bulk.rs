//! The convergent token write: ONE unordered `update` command carrying an upsert per
//! token, each filtered on exactly the unique key and writing only `$setOnInsert`.
//! Whatever happened before — nothing, a partial set, a concurrent twin — the result
//! converges on tokenIndex 0..N-1, and an existing token is never modified. Retries, race
//! losers and self-repair complete sets with it; a first write inserts (group commit).
//!
//! MongoDB 6.0 has no `bulkWrite` command (8.0+), so the statements go in one `update`
//! command: one round trip, whatever the quantity.

use mongodb::Database;
use mongodb::bson::{Bson, DateTime, Document, RawArrayBuf, RawDocumentBuf, oid::ObjectId, rawdoc};

use super::documents::{RevokedShare, new_token};
use super::error::{
    StoreError, TOKENS_PAYMENT_INDEX, index_in_message, unavailable_code, write_concern_unconfirmed,
};
use super::filters::token_filter;
use super::{Store, TOKENS};
use crate::domain::NewIssuance;
use crate::telemetry::metric;

/// What one bulk did: the tokens it inserted (tokenIndex, new _id).
#[derive(Debug, Default)]
pub struct BulkResult {
    pub inserted: Vec<(i64, ObjectId)>,
}

/// Why a bulk statement failed.
pub enum BulkFailure {
    /// Two writers raced to insert the same token; retrying converges.
    TokenRace,
    /// The primary stepped down or shut down mid-bulk (failover), a router could not reach
    /// the shard, or the majority did not confirm the write in time: a 503, not a bug.
    Unavailable(String),
    Other(String),
}

impl Store {
    /// Upserts tokens 0..quantity-1 of `issuance` (those of `revoked` written revoked, if
    /// it inserts them), retrying token-index races a bounded number of times (any other
    /// duplicate key is a real error).
    pub async fn upsert_tokens(
        &self,
        issuance: &NewIssuance,
        revoked: Option<&RevokedShare>,
    ) -> Result<BulkResult, StoreError> {
        let now = DateTime::now();
        let command = bulk_command(issuance, revoked, now, self.database());
        let mut result = BulkResult::default();
        let mut attempt = 0;
        loop {
            let reply = self.database().run_raw_command(command.clone()).await?;
            let upserted = upserted_ids(&reply)?;
            // Counted as the reply says, whatever else it says: a reply that fails one
            // statement still inserted the others.
            metrics::counter!(metric::TOKENS_CREATED_TOTAL).increment(upserted.len() as u64);
            if let Some(share) = revoked {
                let written = upserted.iter().filter(|(index, _)| *index >= share.from);
                share.count_written(written.count() as u64);
            }
            result.inserted.extend(upserted);
            match first_failure(&reply) {
                None => return Ok(result),
                Some(BulkFailure::TokenRace) if attempt < self.config.duplicate_key_retries => {
                    // The racer's token now exists; the retry matches it and inserts the rest.
                    attempt += 1;
                    metrics::counter!(metric::DUPLICATE_KEY_RETRIES_TOTAL).increment(1);
                }
                Some(BulkFailure::TokenRace) => {
                    return Err(StoreError::Internal(
                        "token upsert kept racing past its retry budget".to_owned(),
                    ));
                }
                Some(BulkFailure::Unavailable(message)) => {
                    return Err(StoreError::unavailable(message));
                }
                Some(BulkFailure::Other(message)) => return Err(StoreError::Internal(message)),
            }
        }
    }
}

/// The `update` command: one `$setOnInsert` upsert per token, unordered, with `db`'s
/// pinned write concern (the URI's `wtimeoutMS` included: under a lagging majority the
/// command gives up when the driver's own writes do, not at the request's timeout).
/// Built as raw BSON, so the driver sends these bytes as they are (no `Document` to
/// encode).
pub fn bulk_command(
    issuance: &NewIssuance,
    revoked: Option<&RevokedShare>,
    now: DateTime,
    db: &Database,
) -> RawDocumentBuf {
    let mut updates = RawArrayBuf::new();
    for token_index in 0..i64::from(issuance.params.quantity.get()) {
        updates.push(rawdoc! {
            "q": token_filter(&issuance.key, token_index),
            "u": { "$setOnInsert": new_token(issuance, token_index, revoked, now) },
            "upsert": true,
        });
    }
    rawdoc! {
        "update": TOKENS,
        "updates": updates,
        "ordered": false,
        // A command is sent as written: the client's pinned write concern is not added.
        "writeConcern": super::durability::pinned_command_writes(db),
    }
}

/// (tokenIndex, _id) of every token the reply says was inserted.
pub fn upserted_ids(reply: &Document) -> Result<Vec<(i64, ObjectId)>, StoreError> {
    let Ok(upserted) = reply.get_array("upserted") else {
        return Ok(Vec::new());
    };
    upserted
        .iter()
        .map(|entry| {
            let entry = entry.as_document();
            // Statement i upserts tokenIndex i, so the statement index is the token index.
            let index = entry.and_then(|e| e.get("index")).and_then(bson_integer);
            let id = entry.and_then(|e| e.get_object_id("_id").ok());
            index.zip(id).ok_or_else(|| {
                StoreError::Internal("malformed upserted entry in update reply".to_owned())
            })
        })
        .collect()
}

/// An integer a reply or a document holds, whichever width the server chose.
pub(super) fn bson_integer(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    }
}

/// The first write or write-concern error of the reply, classified.
pub fn first_failure(reply: &Document) -> Option<BulkFailure> {
    if let Ok(wce) = reply.get_document("writeConcernError") {
        let code = wce.get("code").and_then(bson_integer).unwrap_or_default();
        let message = wce
            .get_str("errmsg")
            .unwrap_or("write concern error")
            .to_owned();
        return Some(
            if i32::try_from(code).is_ok_and(write_concern_unconfirmed) {
                BulkFailure::Unavailable(message)
            } else {
                BulkFailure::Other(message)
            },
        );
    }
    let errors = reply.get_array("writeErrors").ok()?;
    let mut failure = None;
    for error in errors.iter().filter_map(Bson::as_document) {
        let code = error.get("code").and_then(bson_integer).unwrap_or_default();
        let message = error.get_str("errmsg").unwrap_or_default();
        let race =
            code == 11000 && index_in_message(message).as_deref() == Some(TOKENS_PAYMENT_INDEX);
        if !race {
            return Some(unavailable_or_other(
                code,
                format!("token upsert failed (code {code})"),
            ));
        }
        failure = Some(BulkFailure::TokenRace);
    }
    failure
}

/// A failover or unreachable code (the node stepped down, or a router lost the shard) is
/// unavailability; the statements are not acknowledged and the client's retry converges.
/// Anything else is a bug.
fn unavailable_or_other(code: i64, message: String) -> BulkFailure {
    if i32::try_from(code).is_ok_and(unavailable_code) {
        BulkFailure::Unavailable(message)
    } else {
        BulkFailure::Other(message)
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn a_stepdown_mid_bulk_is_unavailability_not_a_bug() {
        let stepdown = doc! { "ok": 1, "n": 1, "writeConcernError": {
        "code": 11602, "codeName": "InterruptedDueToReplStateChange",
        "errmsg": "operation was interrupted" } };
        assert!(matches!(
            first_failure(&stepdown),
            Some(BulkFailure::Unavailable(_))
        ));
        for code in [10107, 89, 133] {
            let unavailable =
                doc! { "ok": 1, "writeErrors": [ { "index": 0, "code": code, "errmsg": "" } ] };
            assert!(
                matches!(
                    first_failure(&unavailable),
                    Some(BulkFailure::Unavailable(_))
                ),
                "{code}"
            );
        }
        let other =
            doc! { "ok": 1, "writeErrors": [ { "index": 0, "code": 2, "errmsg": "bad value" } ] };
        assert!(matches!(first_failure(&other), Some(BulkFailure::Other(_))));
    }
}
