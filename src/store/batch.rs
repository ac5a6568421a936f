//! Writes and reads that carry many issuances in one database command, for group commit:
//! one `insert` of many records (`records`), one `insert` of many payments' tokens
//! (`tokens`), one status update, and batched reads of payments, records and tokens. The
//! commands are written by hand, and each result is reported per item, so one item's
//! failure is its own; the tokens' insert is split so that no command passes the server's
//! size limits, so a batch never fails for being large.

use std::collections::HashMap;

use futures::TryStreamExt;
use mongodb::bson::{Document, RawArrayBuf, doc, oid::ObjectId, rawdoc};

use super::documents::{IssuanceDoc, TokenSummary, token_summary_projection};
use super::durability::{OpTime, pinned_command_writes};
use super::error::{StoreError, unavailable_code, write_concern_unconfirmed};
use super::filters::{TOKEN_KEY_FIELDS, issuances_filter, payments_tokens_filter};
use super::payments::{PAYMENTS, PaymentDoc};
use super::{ISSUANCES, Store, TOKENS, placeholder};
use crate::domain::{IssuanceStatus, PaymentKey, TokenStatus};

/// What inserting one record of a batch did.
#[derive(Debug)]
pub enum RecordInsert {
    Inserted,
    /// The payment already has a record (the unique payment index said so).
    Exists,
    Failed(StoreError),
}

/// What inserting one payment's tokens of a batch did.
#[derive(Debug)]
pub enum TokenInsert {
    /// Every token inserted; their summaries in tokenIndex order.
    Inserted(Vec<TokenSummary>),
    /// Another writer inserted some of this payment's tokens first (a duplicate key on the
    /// token index): the set must be converged with the upsert bulk. `inserted`: how many
    /// of its tokens this insert wrote all the same.
    Raced {
        inserted: u32,
    },
    Failed(StoreError),
}

/// What `mark_settled` did.
#[derive(Debug, Default)]
pub struct Marked {
    /// Records marked `issued`.
    pub modified: u64,
    /// Where the primary acknowledged the mark (absent off a replica set, or when there
    /// was nothing to mark).
    pub at: Option<OpTime>,
}

mod records;
mod tokens;

pub use tokens::TokensAck;

/// The parts of a write command's reply (`insert`, `update`) that tell what was written
/// and where.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WriteReply {
    #[serde(default)]
    write_errors: Vec<ReplyWriteError>,
    write_concern_error: Option<ReplyWriteConcernError>,
    #[serde(default)]
    n_modified: u64,
    /// On a replica set, the write's point in the primary's history; for a write that
    /// changed nothing or failed, the node's latest (the server moves the connection's
    /// last op forward first). Not in the server's reference documentation, but in every
    /// write reply of a replica-set member since 3.2: mongos relies on it.
    op_time: Option<OpTime>,
}

#[derive(serde::Deserialize)]
struct ReplyWriteError {
    index: usize,
    code: i32,
    #[serde(default)]
    errmsg: String,
}

#[derive(serde::Deserialize)]
struct ReplyWriteConcernError {
    code: i32,
}

impl Store {
    /// Marks these `issuing` records `issued` (their sets are complete and settled), in
    /// one command, but for any a refund held meanwhile (`hold_place`); returns how many
    /// it marked (`records_by_id` tells which it left) and where in the replica set's
    /// history the primary acknowledged it. Majority like `mark_issued`, with the
    /// client's `wtimeout`: the next read of the records, at majority, must see the mark,
    /// and the mark's majority is what makes a token insert the primary alone
    /// acknowledged durable (`TokensAck::covered_by`).
    pub async fn mark_settled(&self, ids: &[ObjectId]) -> Result<Marked, StoreError> {
        if ids.is_empty() {
            return Ok(Marked::default());
        }
        let command = rawdoc! {
            "update": ISSUANCES,
            "updates": [{
                "q": {
                    "_id": { "$in": ids.iter().copied().collect::<RawArrayBuf>() },
                    "status": IssuanceStatus::Issuing.as_str(),
                    "heldAt": { "$exists": false },
                },
                "u": {
                    "$set": { "status": IssuanceStatus::Issued.as_str() },
                    "$unset": { "unconfirmed": "" },
                },
                "multi": true,
            }],
            "writeConcern": pinned_command_writes(&self.db),
        };
        let reply: WriteReply =
            mongodb::bson::from_document(self.db.run_raw_command(command).await?)
                .map_err(|err| StoreError::Internal(format!("unexpected update reply: {err}")))?;
        if let Some(wce) = reply.write_concern_error {
            return Err(write_concern_failure(wce.code));
        }
        if let Some(error) = reply.write_errors.first() {
            return Err(code_error(error.code));
        }
        Ok(Marked {
            modified: reply.n_modified,
            at: reply.op_time,
        })
    }

    /// Puts these records back from `issued` to `issuing`, for a mark that may stand
    /// over missing tokens (an election came between the tokens and the mark): whatever
    /// happens next, self-repair then finishes them. Majority, like every write.
    pub async fn reopen_records(&self, ids: &[ObjectId]) -> Result<(), StoreError> {
        self.collection(ISSUANCES)
            .update_many(
                doc! { "_id": { "$in": ids }, "status": IssuanceStatus::Issued.as_str() },
                doc! { "$set": { "status": IssuanceStatus::Issuing.as_str() } },
            )
            .await?;
        Ok(())
    }

    /// Takes back the `unconfirmed` records of `ids`, which a batch inserted for
    /// payments its read then found do not stand. Those no one confirmed meanwhile
    /// (`confirm_record`) go: deleted when no refund held the place, so that nothing is
    /// left of the request; turned into a refund's placeholder when one did, because a
    /// hold is a promise that the payment's place stays taken, which an atomic issuance
    /// that read the payment before the refund relies on (`placeholder`). Majority, like
    /// every write. Returns how many it took back.
    pub async fn take_back_unconfirmed(&self, ids: &[ObjectId]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let unconfirmed = doc! {
            "_id": { "$in": ids },
            "status": IssuanceStatus::Issuing.as_str(),
            "unconfirmed": true,
        };
        let mut unheld = unconfirmed.clone();
        unheld.insert("heldAt", doc! { "$exists": false });
        let deleted = self
            .collection(ISSUANCES)
            .delete_many(unheld)
            .await?
            .deleted_count;
        if deleted == ids.len() as u64 {
            return Ok(deleted);
        }
        // A hold that comes after the delete finds no record, and writes its own
        // placeholder.
        let turned = self
            .collection(ISSUANCES)
            .update_many(unconfirmed, placeholder::from_record())
            .await?
            .modified_count;
        Ok(deleted + turned)
    }

    /// The records of `ids` as they are now (to tell which ones `mark_settled` left).
    pub async fn records_by_id(&self, ids: &[ObjectId]) -> Result<Vec<IssuanceDoc>, StoreError> {
        let filter = doc! { "_id": { "$in": ids } };
        Ok(self.records().find(filter).await?.try_collect().await?)
    }

    /// The payments of `keys` that tokenmint has heard of, by key, in one query.
    pub async fn find_payments(
        &self,
        keys: &[&PaymentKey],
    ) -> Result<HashMap<PaymentKey, PaymentDoc>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<Document> = self
            .collection(PAYMENTS)
            .find(issuances_filter(keys))
            .await?
            .try_collect()
            .await?;
        rows.into_iter()
            .map(|row| {
                let payment: PaymentDoc = super::documents::from_document(row)?;
                Ok((payment.key()?, payment))
            })
            .collect()
    }

    /// The issuance records of `keys` (placeholders are none), by key, in one query.
    pub async fn find_records(
        &self,
        keys: &[&PaymentKey],
    ) -> Result<HashMap<PaymentKey, IssuanceDoc>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let mut filter = issuances_filter(keys);
        filter.extend(super::placeholder::records_only());
        let rows: Vec<IssuanceDoc> = self.records().find(filter).await?.try_collect().await?;
        rows.into_iter()
            .map(|record| Ok((record.key()?, record)))
            .collect()
    }

    /// The tokens of the payments of `keys`, by key, each in tokenIndex order, in one
    /// majority read (see `payment_tokens`). Each row is read straight from the reply's
    /// BSON into its summary and its payment's key: a replay's answer is this read, and
    /// building a `Document` per token first (a map of owned keys and values) was about
    /// half of the read's CPU in a profile of half replays.
    pub async fn find_token_sets(
        &self,
        keys: &[&PaymentKey],
    ) -> Result<HashMap<PaymentKey, Vec<TokenSummary>>, StoreError> {
        let mut sets: HashMap<PaymentKey, Vec<TokenSummary>> = HashMap::new();
        if keys.is_empty() {
            return Ok(sets);
        }
        let mut projection = token_summary_projection();
        for field in TOKEN_KEY_FIELDS {
            projection.insert(field, 1);
        }
        let mut rows = self
            .db
            .collection::<PaymentTokenRow>(TOKENS)
            .find(payments_tokens_filter(keys))
            .projection(projection)
            .sort(doc! { "tokenIndex": 1 })
            .await?;
        // The keys asked for, by payment id, so that a row finds its key without parsing
        // it again.
        let mut by_payment: HashMap<&str, Vec<&PaymentKey>> = HashMap::new();
        for key in keys {
            by_payment
                .entry(key.payment_intent_id.as_str())
                .or_default()
                .push(key);
        }
        while let Some(row) = rows.try_next().await? {
            let origin = &row.origin;
            // The filter selects only the keys asked for, so every row finds its own.
            let Some(key) =
                by_payment
                    .get(origin.payment_intent_id.as_str())
                    .and_then(|candidates| {
                        candidates.iter().find(|key| {
                            key.provider.as_str() == origin.provider
                                && key.account_id.as_str() == origin.account_id
                        })
                    })
            else {
                continue;
            };
            let summary = TokenSummary {
                id: row.id,
                token_index: row.token_index,
                status: row.status,
                version: row.version,
            };
            // The key is cloned once per payment, not once per token.
            match sets.get_mut(*key) {
                Some(set) => set.push(summary),
                None => {
                    sets.insert((*key).clone(), vec![summary]);
                }
            }
        }
        Ok(sets)
    }
}

/// One token of `find_token_sets`: its summary's fields (as `TokenSummary` reads them;
/// not flattened, which serde buffers) and its payment's key.
#[derive(serde::Deserialize)]
struct PaymentTokenRow {
    #[serde(rename = "_id")]
    id: ObjectId,
    #[serde(rename = "tokenIndex")]
    token_index: i64,
    status: TokenStatus,
    #[serde(rename = "_version", default)]
    version: i64,
    origin: PaymentOrigin,
}

/// The key fields of a token's `origin`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaymentOrigin {
    provider: String,
    account_id: String,
    payment_intent_id: String,
}

/// A write concern error: written but not confirmed durable, so nothing in the command may
/// be acknowledged. Unavailability (the senders retry) when `write_concern_unconfirmed`
/// says so, else a bug.
fn write_concern_failure(code: i32) -> StoreError {
    let message = format!("write concern failed with code {code}");
    if write_concern_unconfirmed(code) {
        StoreError::unavailable(message)
    } else {
        StoreError::Internal(message)
    }
}

/// A write error's code as a store error: unavailability on a failover or unreachable
/// code, else a bug.
fn code_error(code: i32) -> StoreError {
    if unavailable_code(code) {
        StoreError::unavailable(format!("write failed with code {code}"))
    } else {
        StoreError::Internal(format!("write failed with code {code}"))
    }
}
