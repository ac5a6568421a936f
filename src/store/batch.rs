//! Writes and reads that carry many issuances in one database command, for group commit:
//! one `insert` of many records (`records`), one `insert` of many payments' tokens, one
//! status update, and batched reads of payments, records and tokens. The driver splits the
//! tokens' `insert` when it would pass the server's size limits, so a batch never fails
//! for being large (the records' command, written by hand, carries at most a batch of
//! small records). Each result is reported per item, so one item's failure is its own.

use std::collections::HashMap;

use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, RawDocumentBuf, doc, oid::ObjectId};
use mongodb::error::{Error, ErrorKind, IndexedWriteError};

use super::documents::{IssuanceDoc, TokenSummary, new_token, token_summary_projection};
use super::error::{NOT_PRIMARY_CODES, StoreError, TOKENS_PAYMENT_INDEX, index_in_message};
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

mod records;

impl Store {
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
/// be acknowledged. Unavailability (the senders retry) on a failover code or when the
/// majority was not confirmed in time (`maxTimeMS`, `wtimeout`), else a bug.
fn write_concern_failure(code: i32) -> StoreError {
    const NOT_CONFIRMED_IN_TIME: [i32; 2] = [50, 64];
    if NOT_PRIMARY_CODES.contains(&code) || NOT_CONFIRMED_IN_TIME.contains(&code) {
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
