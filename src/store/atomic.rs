//! Atomic mode: the issuance record and all its tokens in one multi-document transaction
//! (the transactional alternative to the upsert bulk). Either everything is visible or
//! nothing is.
//!
//! A duplicate key on the issuance index means another request already recorded this
//! payment: the transaction is abandoned and the existing record is handed back for the
//! caller to verify. Concurrent first writers collide as write conflicts
//! (TransientTransactionError); the loser retries and then sees the winner's record.

use std::time::Duration;

use mongodb::ClientSession;
use mongodb::bson::{DateTime, RawDocumentBuf, oid::ObjectId};
use mongodb::error::{Error, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{Acknowledgment, ReadConcern, WriteConcern};

use super::documents::{IssuanceDoc, TokenSummary, fresh_tokens, issuance_filter, new_token};
use super::error::{
    ISSUANCES_PAYMENT_INDEX, StoreError, duplicate_key_index, is_transient_transaction_error,
};
use super::{Store, TOKENS};
use crate::domain::NewIssuance;
use crate::telemetry::metric;

/// Transient transaction errors are retried this many times before giving up.
pub const MAX_TRANSACTION_ATTEMPTS: u32 = 10;

/// What an atomic insert did.
#[derive(Debug)]
pub enum AtomicInsert {
    /// Record and tokens committed together; the tokens in tokenIndex order.
    Committed(Vec<TokenSummary>),
    /// The payment already had a record (committed by someone else): this one.
    RecordExists(IssuanceDoc),
}

/// How one transaction attempt ended.
enum Attempt {
    Committed(Vec<TokenSummary>),
    /// The payment's record already exists (committed by someone else).
    RecordExists,
}

impl Store {
    /// Inserts `record` and the tokens of `request` in one transaction, unless the
    /// payment already has a record.
    pub async fn insert_atomically(
        &self,
        record: &IssuanceDoc,
        request: &NewIssuance,
    ) -> Result<AtomicInsert, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        let mut attempt = 1;
        loop {
            match self.try_transaction(&mut session, record, request).await {
                Ok(Attempt::Committed(tokens)) => return Ok(AtomicInsert::Committed(tokens)),
                Ok(Attempt::RecordExists) => {
                    let record = self
                        .records()
                        .find_one(issuance_filter(&request.key))
                        .await?
                        .ok_or_else(|| {
                            StoreError::Internal("issuance record vanished".to_owned())
                        })?;
                    return Ok(AtomicInsert::RecordExists(record));
                }
                Err(err)
                    if is_transient_transaction_error(&err)
                        && attempt < MAX_TRANSACTION_ATTEMPTS =>
                {
                    attempt += 1;
                    metrics::counter!(metric::TRANSACTION_RETRIES_TOTAL).increment(1);
                    // A short, growing pause lets the conflicting transaction commit.
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 5)).await;
                }
                // Still conflicting after every retry: most likely a transaction a crashed
                // instance left open, which the server aborts when its lifetime ends
                // (`transactionLifetimeLimitSeconds`). Retrying later will succeed: 503.
                Err(err) if is_transient_transaction_error(&err) => {
                    return Err(StoreError::Unavailable(err));
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    async fn try_transaction(
        &self,
        session: &mut ClientSession,
        record: &IssuanceDoc,
        request: &NewIssuance,
    ) -> Result<Attempt, Error> {
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).build())
            .await?;
        if let Err(err) = self
            .records()
            .insert_one(record)
            .session(&mut *session)
            .await
        {
            // Leave the session clean for the next attempt; the abort's own failure is moot.
            let _ = session.abort_transaction().await;
            if duplicate_key_index(&err).as_deref() == Some(ISSUANCES_PAYMENT_INDEX) {
                return Ok(Attempt::RecordExists);
            }
            return Err(err);
        }
        let (tokens, inserted) = token_documents(request);
        if let Err(err) = self
            .database()
            .collection::<RawDocumentBuf>(TOKENS)
            .insert_many(tokens)
            .session(&mut *session)
            .await
        {
            let _ = session.abort_transaction().await;
            return Err(err);
        }
        commit_with_retry(session).await?;
        metrics::counter!(metric::TOKENS_CREATED_TOTAL).increment(inserted.len() as u64);
        Ok(Attempt::Committed(fresh_tokens(inserted)))
    }
}

/// Commits, retrying while the outcome is unknown (the commit is idempotent).
async fn commit_with_retry(session: &mut ClientSession) -> Result<(), Error> {
    let mut attempt = 0;
    loop {
        match session.commit_transaction().await {
            Err(err) if err.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) && attempt < 3 => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The token documents of an atomic issuance, with ids chosen here so the answer can
/// name them without reading back.
fn token_documents(request: &NewIssuance) -> (Vec<RawDocumentBuf>, Vec<(i64, ObjectId)>) {
    let now = DateTime::now();
    (0..i64::from(request.params.quantity.get()))
        .map(|token_index| {
            let id = ObjectId::new();
            let mut document = new_token(request, token_index, now);
            document.append_ref("_id", id);
            (document, (token_index, id))
        })
        .unzip()
}
