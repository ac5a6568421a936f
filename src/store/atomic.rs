//! Atomic mode: issuance records and all their tokens in one multi-document transaction
//! (the transactional alternative to the upsert bulk). Either everything is visible or
//! nothing is.
//!
//! One transaction may carry several issuances (group commit in atomic mode): each one's
//! record and tokens still commit together, and its batch-mates commit with them. The
//! records go first, in one ordered `insert`; a duplicate key on the issuance index means
//! a payment's place is taken (a record someone else committed, or a refund's
//! placeholder): the transaction is abandoned, nothing is written, and the caller finds
//! out which payment it was.
//! Concurrent first writers collide as write conflicts (TransientTransactionError); the
//! loser retries and then runs into the winner's record.
//!
//! The caller may give a precondition — a read it needs the answer of before anything
//! commits. It runs while the transaction writes, so its round trip costs no time of its
//! own; a refusal aborts the transaction, and an aborted transaction leaves nothing.

use std::future::Future;
use std::time::Duration;

use mongodb::ClientSession;
use mongodb::bson::{DateTime, RawDocumentBuf, oid::ObjectId};
use mongodb::error::{Error, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::ReadConcern;

use super::documents::{IssuanceDoc, TokenSummary, fresh_tokens, new_token};
use super::error::{
    ISSUANCES_PAYMENT_INDEX, StoreError, duplicate_key_index, is_transient_transaction_error,
};
use super::placeholder::Existing;
use super::{Store, TOKENS};
use crate::domain::NewIssuance;
use crate::telemetry::metric;

/// Transient transaction errors are retried this many times before giving up.
pub const MAX_TRANSACTION_ATTEMPTS: u32 = 10;

/// What an atomic insert of one issuance did.
#[derive(Debug)]
pub enum AtomicInsert {
    /// Record and tokens committed together; the tokens in tokenIndex order.
    Committed(Vec<TokenSummary>),
    /// The payment's place was taken (by a record someone else committed, or a refund's
    /// placeholder): by this.
    RecordExists(Existing),
}

/// What an atomic insert of several issuances did; `R` is what a precondition refused
/// with.
#[derive(Debug)]
pub enum AtomicSetsInsert<R = std::convert::Infallible> {
    /// Every record and token set committed together; the sets in the order given, each
    /// in tokenIndex order.
    Committed(Vec<Vec<TokenSummary>>),
    /// At least one of the payments already had a record: nothing was written.
    RecordExists,
    /// The precondition refused: the transaction was aborted, nothing was written.
    Refused(R),
}

/// One issuance of an atomic insert: its record and what it issues.
pub type AtomicSet<'a> = (&'a IssuanceDoc, &'a NewIssuance);

impl Store {
    /// Inserts `record` and the tokens of `request` in one transaction, unless the
    /// payment already has a record.
    pub async fn insert_atomically(
        &self,
        record: &IssuanceDoc,
        request: &NewIssuance,
    ) -> Result<AtomicInsert, StoreError> {
        let inserted: AtomicSetsInsert = self
            .insert_sets_atomically_unless(&[(record, request)], async { Ok(None) })
            .await?;
        match inserted {
            AtomicSetsInsert::Committed(mut sets) => {
                Ok(AtomicInsert::Committed(sets.pop().unwrap_or_default()))
            }
            AtomicSetsInsert::RecordExists => {
                let existing = self
                    .find_existing(&request.key)
                    .await?
                    .ok_or_else(|| StoreError::Internal("issuance record vanished".to_owned()))?;
                Ok(AtomicInsert::RecordExists(existing))
            }
            AtomicSetsInsert::Refused(never) => match never {},
        }
    }

    /// Inserts every record and its tokens in one transaction, unless one of the payments
    /// already has a record or `refusal` resolves to `Some`. `refusal` is awaited once,
    /// while the first attempt writes. The payments must differ (the caller's job: a
    /// second record of the same payment would only ever find the first).
    pub async fn insert_sets_atomically_unless<R>(
        &self,
        sets: &[AtomicSet<'_>],
        refusal: impl Future<Output = Result<Option<R>, StoreError>> + Send,
    ) -> Result<AtomicSetsInsert<R>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        let mut refusal = Precondition::Pending(Box::pin(refusal));
        let mut attempt = 1;
        loop {
            match self.try_transaction(&mut session, sets, &mut refusal).await {
                Ok(Attempt::Committed(token_sets)) => {
                    return Ok(AtomicSetsInsert::Committed(token_sets));
                }
                Ok(Attempt::RecordExists) => return Ok(AtomicSetsInsert::RecordExists),
                Ok(Attempt::Refused) => {
                    return match refusal {
                        Precondition::Answered(Some(refused)) => {
                            Ok(AtomicSetsInsert::Refused(refused))
                        }
                        _ => Err(StoreError::Internal(
                            "a refused transaction without its refusal".to_owned(),
                        )),
                    };
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
        sets: &[AtomicSet<'_>],
        refusal: &mut Precondition<'_, R>,
    ) -> Result<Attempt, TransactionError> {
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            // The commit inherits the client's pinned `w: majority`, journaled (`durability`).
            .await?;
        // The precondition's read and the writes go together; both answer before commit.
        let (written, refused) =
            tokio::join!(self.write_in_transaction(session, sets), refusal.answer());
        let refused = match refused {
            Ok(refused) => refused,
            Err(err) => {
                let _ = session.abort_transaction().await;
                return Err(TransactionError::Precondition(err));
            }
        };
        if refused {
            // A refusal outranks whatever the writes did: the caller answers it first.
            let _ = session.abort_transaction().await;
            return Ok(Attempt::Refused);
        }
        let Some(inserted) = written? else {
            return Ok(Attempt::RecordExists);
        };
        commit_with_retry(session).await?;
        let created: usize = inserted.iter().map(Vec::len).sum();
        metrics::counter!(metric::TOKENS_CREATED_TOTAL).increment(created as u64);
        Ok(Attempt::Committed(
            inserted.into_iter().map(fresh_tokens).collect(),
        ))
    }

    /// The records, then the tokens, inside the session's transaction; aborted on
    /// failure. `None` when a payment already has a record.
    async fn write_in_transaction(
        &self,
        session: &mut ClientSession,
        sets: &[AtomicSet<'_>],
    ) -> Result<Option<Vec<Vec<(i64, ObjectId)>>>, Error> {
        let records = sets.iter().map(|(record, _)| *record);
        if let Err(err) = self
            .records()
            .insert_many(records)
            .session(&mut *session)
            .await
        {
            // Leave the session clean for the next attempt; the abort's own failure is moot.
            let _ = session.abort_transaction().await;
            if duplicate_key_index(&err).as_deref() == Some(ISSUANCES_PAYMENT_INDEX) {
                return Ok(None);
            }
            return Err(err);
        }
        let now = DateTime::now();
        let mut documents = Vec::new();
        let inserted = sets
            .iter()
            .map(|(_, request)| token_documents(request, now, &mut documents))
            .collect();
        if let Err(err) = self
            .database()
            .collection::<RawDocumentBuf>(TOKENS)
            .insert_many(documents)
            .session(&mut *session)
            .await
        {
            let _ = session.abort_transaction().await;
            return Err(err);
        }
        Ok(Some(inserted))
    }
}

/// How one transaction attempt ended.
enum Attempt {
    Committed(Vec<Vec<TokenSummary>>),
    /// A payment already has a record (committed by someone else).
    RecordExists,
    /// The precondition refused; the transaction was aborted.
    Refused,
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

/// Appends the token documents of `request` to `documents`, with ids chosen here so the
/// answer can name them without reading back; returns their (tokenIndex, id).
fn token_documents(
    request: &NewIssuance,
    now: DateTime,
    documents: &mut Vec<RawDocumentBuf>,
) -> Vec<(i64, ObjectId)> {
    (0..i64::from(request.params.quantity.get()))
        .map(|token_index| {
            let id = ObjectId::new();
            let mut document = new_token(request, token_index, now);
            document.append_ref("_id", id);
            documents.push(document);
            (token_index, id)
        })
        .collect()
}
