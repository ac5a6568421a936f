//! Atomic mode: the issuance record and all its tokens in one multi-document transaction
//! (the transactional alternative to the upsert bulk). Either everything is visible or
//! nothing is.
//!
//! The caller may give a precondition — a read it needs the answer of before anything
//! commits. It runs while the transaction writes, so its round trip costs no time of its
//! own; a refusal aborts the transaction, and an aborted transaction leaves nothing.
//!
//! A duplicate key on the issuance index means another request already recorded this
//! payment: the transaction is abandoned and the existing record is handed back for the
//! caller to verify. Concurrent first writers collide as write conflicts
//! (TransientTransactionError); the loser retries and then sees the winner's record.

use std::future::Future;
use std::time::Duration;

use mongodb::ClientSession;
use mongodb::bson::{DateTime, RawDocumentBuf, oid::ObjectId};
use mongodb::error::{Error, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{Acknowledgment, ReadConcern, WriteConcern};

use super::documents::{IssuanceDoc, TokenSummary, fresh_tokens, new_token};
use super::error::{
    ISSUANCES_PAYMENT_INDEX, StoreError, duplicate_key_index, is_transient_transaction_error,
};
use super::filters::issuance_filter;
use super::{Store, TOKENS};
use crate::domain::NewIssuance;
use crate::telemetry::metric;

/// Transient transaction errors are retried this many times before giving up.
pub const MAX_TRANSACTION_ATTEMPTS: u32 = 10;

/// What an atomic insert did; `R` is what a precondition refused with.
#[derive(Debug)]
pub enum AtomicInsert<R = std::convert::Infallible> {
    /// Record and tokens committed together; the tokens in tokenIndex order.
    Committed(Vec<TokenSummary>),
    /// The payment already had a record (committed by someone else): this one.
    RecordExists(IssuanceDoc),
    /// The precondition refused: the transaction was aborted, nothing was written.
    Refused(R),
}

/// How one transaction attempt ended.
enum Attempt {
    Committed(Vec<TokenSummary>),
    /// The payment's record already exists (committed by someone else).
    RecordExists,
    /// The precondition refused; the transaction was aborted.
    Refused,
}

impl Store {
    /// Inserts `record` and the tokens of `request` in one transaction, unless the
    /// payment already has a record.
    pub async fn insert_atomically(
        &self,
        record: &IssuanceDoc,
        request: &NewIssuance,
    ) -> Result<AtomicInsert, StoreError> {
        self.insert_atomically_unless(record, request, async { Ok(None) })
            .await
    }

    /// `insert_atomically`, committed only if `refusal` resolves to `None`. `refusal` is
    /// awaited once, while the first attempt writes; `Some(r)` aborts the transaction
    /// and is handed back as [`AtomicInsert::Refused`].
    pub async fn insert_atomically_unless<R>(
        &self,
        record: &IssuanceDoc,
        request: &NewIssuance,
        refusal: impl Future<Output = Result<Option<R>, StoreError>> + Send,
    ) -> Result<AtomicInsert<R>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        let mut refusal = Precondition::Pending(Box::pin(refusal));
        let mut attempt = 1;
        loop {
            match self
                .try_transaction(&mut session, record, request, &mut refusal)
                .await
            {
                Ok(Attempt::Committed(tokens)) => return Ok(AtomicInsert::Committed(tokens)),
                Ok(Attempt::Refused) => {
                    return match refusal {
                        Precondition::Answered(Some(refused)) => Ok(AtomicInsert::Refused(refused)),
                        _ => Err(StoreError::Internal(
                            "a refused transaction without its refusal".to_owned(),
                        )),
                    };
                }
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
                Err(TransactionError::Driver(err))
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
                Err(TransactionError::Driver(err)) if is_transient_transaction_error(&err) => {
                    return Err(StoreError::Unavailable(err));
                }
                Err(TransactionError::Precondition(err)) => return Err(err),
                Err(TransactionError::Driver(err)) => return Err(err.into()),
            }
        }
    }

    async fn try_transaction<R>(
        &self,
        session: &mut ClientSession,
        record: &IssuanceDoc,
        request: &NewIssuance,
        refusal: &mut Precondition<'_, R>,
    ) -> Result<Attempt, TransactionError> {
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).build())
            .await?;
        // The precondition's read and the writes go together; both answer before commit.
        let (written, refused) = tokio::join!(
            self.write_in_transaction(session, record, request),
            refusal.answer()
        );
        let refused = match refused {
            Ok(refused) => refused,
            Err(err) => {
                let _ = session.abort_transaction().await;
                return Err(TransactionError::Precondition(err));
            }
        };
        let inserted = match written? {
            Written::Tokens(inserted) => inserted,
            Written::RecordExists => return Ok(Attempt::RecordExists),
        };
        if refused {
            let _ = session.abort_transaction().await;
            return Ok(Attempt::Refused);
        }
        commit_with_retry(session).await?;
        metrics::counter!(metric::TOKENS_CREATED_TOTAL).increment(inserted.len() as u64);
        Ok(Attempt::Committed(fresh_tokens(inserted)))
    }

    /// The record, then the tokens, inside the session's transaction; aborted on failure.
    async fn write_in_transaction(
        &self,
        session: &mut ClientSession,
        record: &IssuanceDoc,
        request: &NewIssuance,
    ) -> Result<Written, Error> {
        if let Err(err) = self
            .records()
            .insert_one(record)
            .session(&mut *session)
            .await
        {
            // Leave the session clean for the next attempt; the abort's own failure is moot.
            let _ = session.abort_transaction().await;
            if duplicate_key_index(&err).as_deref() == Some(ISSUANCES_PAYMENT_INDEX) {
                return Ok(Written::RecordExists);
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
        Ok(Written::Tokens(inserted))
    }
}

/// What the writes of one attempt did.
enum Written {
    Tokens(Vec<(i64, ObjectId)>),
    RecordExists,
}

/// Why an attempt failed: the driver (maybe transient, retried) or the precondition.
enum TransactionError {
    Driver(Error),
    Precondition(StoreError),
}

impl From<Error> for TransactionError {
    fn from(err: Error) -> Self {
        Self::Driver(err)
    }
}

/// A precondition, awaited once whatever the number of attempts.
enum Precondition<'a, R> {
    Pending(std::pin::Pin<Box<dyn Future<Output = Result<Option<R>, StoreError>> + Send + 'a>>),
    Answered(Option<R>),
}

impl<R> Precondition<'_, R> {
    /// Whether the precondition refuses (awaiting it the first time).
    async fn answer(&mut self) -> Result<bool, StoreError> {
        if let Self::Pending(pending) = self {
            *self = Self::Answered(pending.await?);
        }
        Ok(matches!(self, Self::Answered(Some(_))))
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
