//! Writes and reads that carry many issuances in one database command, for group commit:
//! one `insert` of many records, one `insert` of many payments' tokens, one status update,
//! and batched reads of payments, records and tokens. The driver splits an `insert` that
//! would pass the server's size limits into several commands, so a batch never fails for
//! being large. Each result is reported per item, so one item's failure is its own.

use std::collections::HashMap;
use std::time::Duration;

use futures::TryStreamExt;
use futures::future::join_all;
use mongodb::bson::{DateTime, Document, RawArrayBuf, RawDocumentBuf, doc, oid::ObjectId, rawdoc};
use mongodb::error::{Error, ErrorKind, IndexedWriteError};
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria};

use super::documents::{IssuanceDoc, TokenSummary, new_token, token_summary_projection};
use super::durability::durable_command_writes;
use super::error::{
    ISSUANCES_PAYMENT_INDEX, NOT_PRIMARY_CODES, StoreError, TOKENS_PAYMENT_INDEX, index_in_message,
};
use super::filters::{issuances_filter, payments_tokens_filter};
use super::payments::{PAYMENTS, PaymentDoc};
use super::{ISSUANCES, Store, TOKENS};
use crate::domain::{IssuanceStatus, NewIssuance, PaymentKey};
use crate::telemetry::metric;

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
    /// token index): the set must be converged with the upsert bulk.
    Raced,
    Failed(StoreError),
}

/// A batch's records on a replica set are acknowledged by the primary alone (`w: 1`): the
/// one exception to the client's pinned majority (`durability`). Nothing answers from a
/// record before the `w: majority` token insert that follows it, and that insert's
/// majority commit point covers everything before it in the one oplog; a read at majority
/// before then does not see the record, and the writes that decide on it (claim, upsert)
/// do. On a sharded cluster the two may live on different shards, so records are written
/// with the majority there.
///
/// How long a batch's record insert may run on the server (`maxTimeMS`) before its
/// records are tried one by one. An insert of a full batch of records takes milliseconds;
/// one that runs this long is waiting on a payment's key that another transaction holds
/// (one a killed instance left open, which the server aborts only at the end of its
/// lifetime), and in one command every record of the batch would wait with it. The server
/// must stop the wait itself: an insert left waiting there, with the client gone, holds
/// back the majority commit point, and with it every `w: majority` write of the service.
const RECORD_INSERT_PATIENCE: Duration = Duration::from_millis(1500);

/// The server's code for an operation stopped by its `maxTimeMS`.
const MAX_TIME_EXPIRED: i32 = 50;

impl Store {
    /// Inserts `records` in one unordered command. If that command runs out of
    /// `RECORD_INSERT_PATIENCE`, each record is inserted alone, each as patient: the one
    /// whose key is held fails alone (`Contended`), the others go on.
    pub async fn insert_records(
        &self,
        records: &[IssuanceDoc],
    ) -> Result<Vec<RecordInsert>, StoreError> {
        match self.insert_records_command(records).await {
            Err(RecordsCommand::Failed(err)) => Err(err),
            Ok(inserted) => Ok(inserted),
            Err(RecordsCommand::OutOfTime) => {
                tracing::warn!(
                    records = records.len(),
                    "a batch's record insert was held up; inserting its records one by one"
                );
                let alone = records
                    .iter()
                    .map(|record| self.insert_record_alone(record));
                Ok(join_all(alone).await)
            }
        }
    }

    /// One `insert` command of `records`, written by hand for its `maxTimeMS` (the
    /// driver's `insert_many` has none). Acknowledged by the primary alone on a replica
    /// set (`primary_only`), with the majority on a sharded cluster. The command is not a
    /// retryable write: a failover fails it, and the requests it carried are retried by
    /// their senders, converging on whatever it wrote.
    async fn insert_records_command(
        &self,
        records: &[IssuanceDoc],
    ) -> Result<Vec<RecordInsert>, RecordsCommand> {
        let write_concern = if self.is_sharded().await? {
            durable_command_writes()
        } else {
            rawdoc! { "w": 1, "j": false }
        };
        let documents = records
            .iter()
            .map(mongodb::bson::to_raw_document_buf)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| StoreError::Internal(format!("cannot encode a record: {err}")))?;
        let mut command = rawdoc! {
            "insert": ISSUANCES,
            "ordered": false,
            "maxTimeMS": RECORD_INSERT_PATIENCE.as_millis() as i64,
            "writeConcern": write_concern,
        };
        command.append("documents", RawArrayBuf::from_iter(documents));
        let reply = match self.db.run_raw_command(command).await {
            Ok(reply) => reply,
            Err(err) if command_code(&err) == Some(MAX_TIME_EXPIRED) => {
                return Err(RecordsCommand::OutOfTime);
            }
            Err(err) => return Err(RecordsCommand::Failed(err.into())),
        };
        let reply: InsertReply = mongodb::bson::from_document(reply)
            .map_err(|err| StoreError::Internal(format!("unexpected insert reply: {err}")))?;
        if let Some(wce) = reply.write_concern_error {
            return Err(RecordsCommand::Failed(write_concern_failure(wce.code)));
        }
        let mut results: Vec<RecordInsert> =
            records.iter().map(|_| RecordInsert::Inserted).collect();
        for error in reply.write_errors {
            if error.code == MAX_TIME_EXPIRED {
                return Err(RecordsCommand::OutOfTime);
            }
            let duplicate_on = (error.code == 11000)
                .then(|| index_in_message(&error.errmsg))
                .flatten();
            if let Some(slot) = results.get_mut(error.index) {
                *slot = match duplicate_on.as_deref() {
                    Some(ISSUANCES_PAYMENT_INDEX) => RecordInsert::Exists,
                    // Its `_id` is new, chosen here: a command that ran out of time wrote
                    // it already.
                    Some("_id_") => RecordInsert::Inserted,
                    _ => RecordInsert::Failed(code_error(error.code)),
                };
            }
        }
        Ok(results)
    }

    /// One record of a batch whose insert ran out of time. That command may have written
    /// this record before it stopped (with the same `_id`), so a duplicate key is this
    /// record's own write unless the record under that key has another `_id`.
    async fn insert_record_alone(&self, record: &IssuanceDoc) -> RecordInsert {
        let inserted = match self
            .insert_records_command(std::slice::from_ref(record))
            .await
        {
            Ok(mut inserted) => inserted.pop().unwrap_or(RecordInsert::Inserted),
            Err(RecordsCommand::Failed(err)) => RecordInsert::Failed(err),
            Err(RecordsCommand::OutOfTime) => {
                return RecordInsert::Failed(StoreError::Contended(Error::custom(
                    "the payment's record key stayed held by another transaction",
                )));
            }
        };
        if !matches!(inserted, RecordInsert::Exists) {
            return inserted;
        }
        // Read locally on the primary: the first command's write is acknowledged by the
        // primary alone, and the token insert that follows makes it majority.
        let ours = self
            .records()
            .find_one(doc! { "_id": record.id })
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .read_concern(ReadConcern::local())
            .await;
        match ours {
            Ok(Some(_)) => RecordInsert::Inserted,
            Ok(None) => RecordInsert::Exists,
            Err(err) => RecordInsert::Failed(err.into()),
        }
    }

    /// Inserts the tokens of every set (unordered, the client's `w: majority`), with `_id`s chosen here
    /// so that the answers name them without a read-back.
    pub async fn insert_token_sets(
        &self,
        sets: &[&NewIssuance],
    ) -> Result<Vec<TokenInsert>, StoreError> {
        let now = DateTime::now();
        let mut documents: Vec<RawDocumentBuf> = Vec::new();
        // Which set each document belongs to, and each set's summaries.
        let mut owner_of: Vec<usize> = Vec::new();
        let mut summaries: Vec<Vec<TokenSummary>> = Vec::with_capacity(sets.len());
        for (set_index, set) in sets.iter().enumerate() {
            let quantity = i64::from(set.params.quantity.get());
            let mut tokens = Vec::with_capacity(quantity as usize);
            for token_index in 0..quantity {
                let id = ObjectId::new();
                let mut document = new_token(set, token_index, now);
                document.append_ref("_id", id);
                documents.push(document);
                owner_of.push(set_index);
                tokens.push(TokenSummary {
                    id,
                    token_index,
                    status: crate::domain::TokenStatus::Active,
                    version: 0,
                });
            }
            summaries.push(tokens);
        }
        let mut failures: Vec<Option<TokenInsert>> = sets.iter().map(|_| None).collect();
        let mut failed_documents = 0;
        if !documents.is_empty() {
            let outcome = self
                .db
                .collection::<RawDocumentBuf>(TOKENS)
                .insert_many(&documents)
                .ordered(false)
                .await;
            let errors = per_item_errors(outcome)?;
            failed_documents = errors.len();
            for (index, error) in errors {
                let Some(&set_index) = owner_of.get(index) else {
                    continue;
                };
                let failure = if is_duplicate_on(&error, TOKENS_PAYMENT_INDEX) {
                    TokenInsert::Raced
                } else {
                    TokenInsert::Failed(code_error(error.code))
                };
                // A real failure outranks a race for the same set.
                if !matches!(failures[set_index], Some(TokenInsert::Failed(_))) {
                    failures[set_index] = Some(failure);
                }
            }
        }
        metrics::counter!(metric::TOKENS_CREATED_TOTAL)
            .increment((documents.len() - failed_documents) as u64);
        Ok(summaries
            .into_iter()
            .zip(failures)
            .map(|(tokens, failure)| failure.unwrap_or(TokenInsert::Inserted(tokens)))
            .collect())
    }

    /// Marks these `issuing` records `issued` (their sets are complete and settled), in
    /// one command, but for any a refund held meanwhile (`hold_place`); returns how many
    /// it marked (`records_by_id` tells which it left). Majority like `mark_issued`: the
    /// next read of the records, at majority, must see the mark.
    pub async fn mark_settled(&self, ids: &[ObjectId]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let marked = self
            .collection(ISSUANCES)
            .update_many(
                doc! {
                    "_id": { "$in": ids },
                    "status": IssuanceStatus::Issuing.as_str(),
                    "heldAt": { "$exists": false },
                },
                doc! { "$set": { "status": IssuanceStatus::Issued.as_str() } },
            )
            .await?;
        Ok(marked.modified_count)
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
    /// majority read (see `payment_tokens`).
    pub async fn find_token_sets(
        &self,
        keys: &[&PaymentKey],
    ) -> Result<HashMap<PaymentKey, Vec<TokenSummary>>, StoreError> {
        let mut sets: HashMap<PaymentKey, Vec<TokenSummary>> = HashMap::new();
        if keys.is_empty() {
            return Ok(sets);
        }
        let mut projection = token_summary_projection();
        projection.insert("origin", 1);
        let rows: Vec<Document> = self
            .collection(TOKENS)
            .find(payments_tokens_filter(keys))
            .projection(projection)
            .sort(doc! { "tokenIndex": 1 })
            .await?
            .try_collect()
            .await?;
        for row in rows {
            let origin = row.get_document("origin").cloned().unwrap_or_default();
            let text = |name: &str| origin.get_str(name).unwrap_or_default().to_owned();
            let key = super::documents::stored_key(
                &text("provider"),
                &text("accountId"),
                &text("paymentIntentId"),
            )?;
            let summary: TokenSummary = super::documents::from_document(row)?;
            sets.entry(key).or_default().push(summary);
        }
        Ok(sets)
    }
}

/// Why a hand-written records insert did not report per record.
enum RecordsCommand {
    /// Stopped by its `maxTimeMS`: some records may be written, some not.
    OutOfTime,
    /// Failed as a whole.
    Failed(StoreError),
}

impl From<StoreError> for RecordsCommand {
    fn from(err: StoreError) -> Self {
        RecordsCommand::Failed(err)
    }
}

/// The parts of an `insert` command's reply that tell what was written.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct InsertReply {
    #[serde(default)]
    write_errors: Vec<ReplyWriteError>,
    write_concern_error: Option<ReplyWriteConcernError>,
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

/// The server code of a command that failed as a whole.
fn command_code(err: &Error) -> Option<i32> {
    match err.kind.as_ref() {
        ErrorKind::Command(cmd) => Some(cmd.code),
        _ => None,
    }
}

/// The per-item write errors of an unordered insert; `Err` when the command failed as a
/// whole (no item can be said to have been written).
fn per_item_errors<T>(
    outcome: Result<T, Error>,
) -> Result<Vec<(usize, IndexedWriteError)>, StoreError> {
    match outcome {
        Ok(_) => Ok(Vec::new()),
        Err(err) => match err.kind.as_ref() {
            ErrorKind::InsertMany(failure) => match &failure.write_concern_error {
                Some(wce) => Err(write_concern_failure(wce.code)),
                None => Ok(failure
                    .write_errors
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| (e.index, e))
                    .collect()),
            },
            _ => Err(err.into()),
        },
    }
}

/// A write concern error: written but not confirmed durable, so nothing in the command may
/// be acknowledged. Unavailability on a failover code (the command is retried by its
/// senders), else a bug.
fn write_concern_failure(code: i32) -> StoreError {
    if NOT_PRIMARY_CODES.contains(&code) {
        StoreError::Unavailable(Error::custom(format!(
            "write concern failed with code {code}"
        )))
    } else {
        StoreError::Internal(format!("write concern failed with code {code}"))
    }
}

fn is_duplicate_on(error: &IndexedWriteError, index: &str) -> bool {
    error.code == 11000 && index_in_message(&error.message).as_deref() == Some(index)
}

/// A write error's code as a store error: unavailability on a failover code, else a bug.
fn code_error(code: i32) -> StoreError {
    if NOT_PRIMARY_CODES.contains(&code) {
        StoreError::Unavailable(Error::custom(format!("write failed with code {code}")))
    } else {
        StoreError::Internal(format!("write failed with code {code}"))
    }
}
