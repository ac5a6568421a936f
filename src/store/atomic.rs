//! Atomic mode: issuance records and all their tokens in one multi-document transaction
//! (the transactional alternative to the upsert bulk). Either everything is visible or
//! nothing is.
//!
//! One transaction may carry several issuances (group commit in atomic mode): each one's
//! record and tokens still commit together, and its batch-mates commit with them. The
//! records go first, in one ordered `insert`, then the tokens, while the caller's plan
//! reads what it needs; the plan may name records that commit `issuing` instead, and the
//! share of their tokens the payment no longer stands for, revoked before anything
//! commits (more updates inside the transaction, only then). A duplicate key on either
//! unique index means a payment's place is taken (a record and tokens someone else
//! committed, or a refund's placeholder): the transaction is abandoned, nothing is
//! written, and the caller finds out which payment it was.
//! Concurrent first writers collide as write conflicts (TransientTransactionError); the
//! loser retries and then runs into the winner's record.
//!
//! The plan — the caller's read and decision — runs while the transaction writes, so its
//! round trip costs no time of its own; a refusal aborts the transaction, and an aborted
//! transaction leaves nothing.

use std::future::Future;
use std::pin::{Pin, pin};

use futures::future::{MaybeDone, maybe_done};

use mongodb::ClientSession;
use mongodb::bson::{DateTime, Document, RawDocumentBuf, doc, oid::ObjectId};
use mongodb::error::{Error, UNKNOWN_TRANSACTION_COMMIT_RESULT};

use super::documents::{IssuanceDoc, RevokedShare, TokenSummary, fresh_tokens, new_token};
use super::durability::{abort_quietly, start_snapshot_transaction};
use super::error::{
    ISSUANCES_PAYMENT_INDEX, StoreError, TOKENS_PAYMENT_INDEX, duplicate_key_index,
    is_transient_transaction_error, is_write_conflict,
};
use super::filters::active_from_filter;
use super::placeholder::Existing;
use super::retry;
use super::{Store, TOKENS};
use crate::domain::{IssuanceStatus, NewIssuance, TokenStatus};
use crate::telemetry::metric;

/// What an atomic insert of one issuance did.
#[derive(Debug)]
pub enum AtomicInsert {
    /// Record and tokens committed together; the tokens in tokenIndex order.
    Committed(Vec<TokenSummary>),
    /// The payment's place was taken (by a record someone else committed, or a refund's
    /// placeholder): by this, or by something that was gone (expired) when read.
    RecordExists(Option<Existing>),
}

/// What an atomic insert of several issuances did; `R` is what a plan refused with.
#[derive(Debug)]
pub enum AtomicSetsInsert<R = std::convert::Infallible> {
    /// Every record and token set committed together, in the order of the requests;
    /// each set in tokenIndex order.
    Committed(Vec<(IssuanceDoc, Vec<TokenSummary>)>),
    /// At least one of the payments' places was taken already: nothing was written.
    RecordExists,
    /// The plan refused: the transaction was aborted, nothing was written.
    Refused(R),
}

/// What a transaction's plan decides once it has read what it needs: which of the
/// records (by `_id`) commit `issuing` rather than as given, each with the share of its
/// tokens to commit revoked, if any; or a refusal.
pub type AtomicPlan<R> = Result<Vec<(ObjectId, Option<RevokedShare>)>, R>;

/// One issuance of an atomic insert: its record and what it issues.
pub type AtomicSet<'a> = (&'a IssuanceDoc, &'a NewIssuance);

impl Store {
    /// Inserts `record` and the tokens of `request` in one transaction (those of
    /// `revoked` committed revoked), unless the payment already has a record.
    pub async fn insert_atomically(
        &self,
        record: &IssuanceDoc,
        request: &NewIssuance,
        revoked: Option<RevokedShare>,
    ) -> Result<AtomicInsert, StoreError> {
        let named = revoked.map(|share| vec![(record.id, Some(share))]);
        let plan = async { Ok(Ok(named.unwrap_or_default())) };
        let inserted: AtomicSetsInsert = self
            .insert_sets_atomically(&[(record, request)], plan)
            .await?;
        match inserted {
            AtomicSetsInsert::Committed(mut sets) => Ok(AtomicInsert::Committed(
                sets.pop().map(|(_, tokens)| tokens).unwrap_or_default(),
            )),
            AtomicSetsInsert::RecordExists => Ok(AtomicInsert::RecordExists(
                self.find_existing(&request.key).await?,
            )),
            AtomicSetsInsert::Refused(never) => match never {},
        }
    }

    /// Inserts every record and its tokens in one transaction, unless one of the
    /// payments' places is taken or `plan` refuses; the records `plan` names commit
    /// `issuing`, with the shares it names revoked (more updates inside the transaction,
    /// only when it names any).
    /// `plan` is awaited once, while the first attempt writes. The payments must differ
    /// (the caller's job: a second record of the same payment would only ever find the
    /// first).
    pub async fn insert_sets_atomically<R>(
        &self,
        sets: &[AtomicSet<'_>],
        plan: impl Future<Output = Result<AtomicPlan<R>, StoreError>> + Send,
    ) -> Result<AtomicSetsInsert<R>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        // Awaited beside the first attempt's writes; later attempts find its answer.
        let mut plan = pin!(maybe_done(plan));
        let mut attempt = 1;
        loop {
            match self
                .try_transaction(&mut session, sets, plan.as_mut())
                .await
            {
                Ok(Attempt::Committed(token_sets)) => {
                    let Some(Ok(Ok(issuing))) = plan.as_mut().take_output() else {
                        return Err(StoreError::Internal(
                            "a committed transaction without its plan".to_owned(),
                        ));
                    };
                    return Ok(AtomicSetsInsert::Committed(committed_sets(
                        sets, token_sets, &issuing,
                    )));
                }
                Ok(Attempt::RecordExists) => return Ok(AtomicSetsInsert::RecordExists),
                Ok(Attempt::Refused) => {
                    let Some(Ok(Err(refused))) = plan.as_mut().take_output() else {
                        return Err(StoreError::Internal(
                            "a refused transaction without its refusal".to_owned(),
                        ));
                    };
                    return Ok(AtomicSetsInsert::Refused(refused));
                }
                Err(TransactionError::Driver(err))
                    if is_transient_transaction_error(&err)
                        && retry::TRANSACTION.allows_another(attempt) =>
                {
                    attempt += 1;
                    pause_before_transaction(attempt).await;
                }
                // Still transient after every retry: for the batch as a whole.
                Err(TransactionError::Driver(err)) if is_transient_transaction_error(&err) => {
                    return Err(transaction_gave_up(err));
                }
                Err(TransactionError::Precondition(err)) => return Err(err),
                Err(TransactionError::Driver(err)) => return Err(err.into()),
            }
        }
    }

    /// One attempt: the writes and (on the first attempt) the plan's read together, then
    /// the plan's `issuing` records and revoked shares, then the commit. A refusal, or a
    /// plan that failed, aborts before anything commits.
    async fn try_transaction<R, P>(
        &self,
        session: &mut ClientSession,
        sets: &[AtomicSet<'_>],
        mut plan: Pin<&mut MaybeDone<P>>,
    ) -> Result<Attempt, TransactionError>
    where
        P: Future<Output = Result<AtomicPlan<R>, StoreError>>,
    {
        start_snapshot_transaction(session).await?;
        // The plan's read and the writes go together; both answer before commit.
        // The tokens' time, which the plan's revoke writes too.
        let now = DateTime::now();
        let (written, ()) =
            tokio::join!(self.write_in_transaction(session, sets, now), plan.as_mut());
        let issuing = match plan.output_mut() {
            Some(Ok(Ok(issuing))) => issuing.clone(),
            // A refusal outranks whatever the writes did: the caller answers it first.
            Some(Ok(Err(_))) => {
                abort_quietly(session).await;
                return Ok(Attempt::Refused);
            }
            Some(Err(err)) => {
                let err = err.clone();
                abort_quietly(session).await;
                return Err(TransactionError::Precondition(err));
            }
            None => unreachable!("a joined plan is done"),
        };
        let Some(inserted) = written? else {
            return Ok(Attempt::RecordExists);
        };
        if let Err(err) = self.apply_plan(session, sets, &issuing, now).await {
            abort_quietly(session).await;
            return Err(err.into());
        }
        commit_with_retry(session).await?;
        let created: usize = inserted.iter().map(Vec::len).sum();
        metrics::counter!(metric::TOKENS_CREATED_TOTAL).increment(created as u64);
        Ok(Attempt::Committed(
            sets.iter()
                .zip(inserted)
                .map(|((record, _), tokens)| {
                    let share = share_of(&issuing, record);
                    let tokens = fresh_tokens(tokens, share);
                    if let Some(share) = share {
                        let revoked = tokens.iter().filter(|t| t.status == TokenStatus::Revoked);
                        share.count_written(revoked.count() as u64);
                    }
                    tokens
                })
                .collect(),
        ))
    }

    /// The plan's writes inside the transaction: the named records that are not
    /// `issuing` already made so, then each named share revoked as if written so (at
    /// `now`, the tokens' time, and their first version: nobody saw them active), before
    /// the tokens are ever visible.
    async fn apply_plan(
        &self,
        session: &mut ClientSession,
        sets: &[AtomicSet<'_>],
        issuing: &[(ObjectId, Option<RevokedShare>)],
        now: DateTime,
    ) -> Result<(), Error> {
        let downgrade: Vec<ObjectId> = sets
            .iter()
            .filter(|(record, _)| {
                record.status != IssuanceStatus::Issuing
                    && issuing.iter().any(|(id, _)| *id == record.id)
            })
            .map(|(record, _)| record.id)
            .collect();
        if !downgrade.is_empty() {
            self.records()
                .update_many(
                    doc! { "_id": { "$in": downgrade } },
                    doc! { "$set": { "status": IssuanceStatus::Issuing.as_str() } },
                )
                .session(&mut *session)
                .await?;
        }
        for (record, request) in sets {
            if let Some(share) = share_of(issuing, record) {
                self.database()
                    .collection::<Document>(TOKENS)
                    .update_many(
                        active_from_filter(&request.key, share.from),
                        share.written_revoked(now),
                    )
                    .session(&mut *session)
                    .await?;
            }
        }
        Ok(())
    }

    /// The records, then the tokens, inside the session's transaction; aborted on
    /// failure. `None` when a payment's place is taken (a record or placeholder in
    /// `issuances`, or tokens).
    async fn write_in_transaction(
        &self,
        session: &mut ClientSession,
        sets: &[AtomicSet<'_>],
        now: DateTime,
    ) -> Result<Option<Vec<Vec<(i64, ObjectId)>>>, Error> {
        let taken = |err: &Error, index: &str| duplicate_key_index(err).as_deref() == Some(index);
        let records = sets.iter().map(|(record, _)| *record);
        if let Err(err) = self
            .records()
            .insert_many(records)
            .session(&mut *session)
            .await
        {
            abort_quietly(session).await;
            return if taken(&err, ISSUANCES_PAYMENT_INDEX) {
                Ok(None)
            } else {
                Err(err)
            };
        }
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
            abort_quietly(session).await;
            return if taken(&err, TOKENS_PAYMENT_INDEX) {
                Ok(None)
            } else {
                Err(err)
            };
        }
        Ok(Some(inserted))
    }
}

/// How one transaction attempt ended.
enum Attempt {
    Committed(Vec<Vec<TokenSummary>>),
    /// A payment's place is taken (by someone else's committed record or tokens).
    RecordExists,
    /// The plan refused; the transaction was aborted.
    Refused,
}

/// Why an attempt failed: the driver (maybe transient, retried) or the plan's read.
enum TransactionError {
    Driver(Error),
    Precondition(StoreError),
}

impl From<Error> for TransactionError {
    fn from(err: Error) -> Self {
        Self::Driver(err)
    }
}

/// The committed records (those named in `issuing` committed `issuing`) with their
/// token sets, in the order of `sets`.
fn committed_sets(
    sets: &[AtomicSet<'_>],
    token_sets: Vec<Vec<TokenSummary>>,
    issuing: &[(ObjectId, Option<RevokedShare>)],
) -> Vec<(IssuanceDoc, Vec<TokenSummary>)> {
    sets.iter()
        .zip(token_sets)
        .map(|((record, _), tokens)| {
            let mut record = (*record).clone();
            if issuing.iter().any(|(id, _)| *id == record.id) {
                record.status = IssuanceStatus::Issuing;
            }
            (record, tokens)
        })
        .collect()
}

/// The share of `record`'s tokens the plan revokes, if any.
fn share_of<'a>(
    issuing: &'a [(ObjectId, Option<RevokedShare>)],
    record: &IssuanceDoc,
) -> Option<&'a RevokedShare> {
    issuing
        .iter()
        .find(|(id, _)| *id == record.id)
        .and_then(|(_, share)| share.as_ref())
}

/// Commits, retrying while the outcome is unknown (the commit is idempotent).
pub(super) async fn commit_with_retry(session: &mut ClientSession) -> Result<(), Error> {
    let mut attempts = 1;
    loop {
        match session.commit_transaction().await {
            Err(err)
                if err.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                    && retry::UNKNOWN_COMMIT.allows_another(attempts) =>
            {
                attempts += 1;
            }
            other => return other,
        }
    }
}

/// Counts a transaction's retry and waits before its `attempt`-th try: a short, growing
/// pause lets the conflicting transaction commit.
pub(super) async fn pause_before_transaction(attempt: u32) {
    metrics::counter!(metric::TRANSACTION_RETRIES_TOTAL).increment(1);
    tokio::time::sleep(retry::transaction_pause(attempt)).await;
}

/// What a transaction still failing transiently after every retry is: still conflicting,
/// another transaction holds one of its keys (`StoreError::Contended`); any other
/// transient error (a failover, a transaction the server lost) is an outage.
pub(super) fn transaction_gave_up(err: Error) -> StoreError {
    if is_write_conflict(&err) {
        StoreError::Contended(err)
    } else {
        StoreError::Unavailable(err)
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
            let mut document = new_token(request, token_index, None, now);
            document.append_ref("_id", id);
            documents.push(document);
            (token_index, id)
        })
        .collect()
}
