//! Group commit: concurrent issuances share database commands.
//!
//! Requests queue, one queue per mode; a few writer tasks per queue each take whatever has
//! queued (at least one, at most `MAX_BATCH`, no waiting for more: at low load a batch is
//! one request and nothing is added to its latency) and commit it with a fixed number of commands, whatever its size:
//! 1. one read of the batch's payments: a payment known failed, canceled or refunded is
//!    refused, nothing written;
//! 2. one `insert` of the records (status `issuing`): a record that exists already makes
//!    its request a replay (step 6);
//! 3. one `insert` of the claimed payments' tokens (`w: majority`);
//! 4. one read of the payments again: the settle after every token write (a refund
//!    recorded meanwhile revokes the tokens just written);
//! 5. at the same time as 4, one update marking the records `issued`; then the answers.
//! 6. replays, concurrently with 3–5: one read of their records and one of their tokens;
//!    a complete, matching set is answered from those, anything else takes the
//!    one-request path (verify, complete with the upsert bulk, take over a pending record).
//!
//! Atomic mode writes the batch's records (`issued`) and tokens in one transaction
//! instead of steps 2–3, so each issuance still commits whole; step 1's read runs while
//! that transaction writes, and a refusal aborts it before commit. Then it settles
//! against that same read, without step 4's second one (no mark either: the records
//! committed `issued`): a refund recorded after the read holds the payment's place in
//! `issuances` before it revokes, which either waits for the commit (and then revokes
//! the tokens) or, by a placeholder, stops the transaction (`store::placeholder`). A
//! refused payment, or one whose place was taken already, aborts the transaction, which
//! leaves nothing: the next one goes without those requests (replays, answered as in
//! step 6 once the rest committed; a placeholder is taken over on the one-request path).
//!
//! Each request's answer depends only on its own items' results: a failed item fails its
//! request alone, a token race sends its payment to the convergent upsert bulk, and a
//! command that fails as a whole fails the requests it carried (their records, if any,
//! stay `issuing` for self-repair; an aborted transaction left none). A shared transaction
//! that fails for another reason than an outage may have failed for one item: its
//! requests try one by one. A crash mid-batch
//! leaves only `issuing` records, or, between the mark (or commit) and the settle, marked
//! records whose settle the sweep of recently withdrawn payments does.

use std::collections::HashMap;
use std::sync::Arc;

mod atomic;

use futures::future::join_all;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::issue::refuse_unless_standing;
use super::{IssueError, IssueOutcome, IssuedTokens, Issuer};
use crate::domain::{IssuanceMode, IssuanceStatus, NewIssuance, PaymentKey};
use crate::store::{IssuanceDoc, PaymentDoc, RecordInsert, StoreError, TokenInsert, TokenSummary};
use crate::telemetry::metric;

/// Writer tasks per mode: up to this many batches of a mode are in flight while the next
/// ones gather. Two keep the database busy while the next batch gathers; more split the
/// queue into smaller batches (measured at concurrency 32: one writer 16 issuances a batch, two 9, four 6 —
/// and four cost mongod the most per issuance).
const WRITERS: usize = 2;
/// Most requests per batch.
const MAX_BATCH: usize = 256;
/// Most tokens per batch: bounds the memory one batch holds (the driver splits the insert
/// itself if it passes the server's limits); a single payment always fits.
const MAX_BATCH_TOKENS: u64 = 50_000;
/// Requests waiting beyond this make their senders wait for room (backpressure).
const QUEUE: usize = 4096;

type Answer = oneshot::Sender<Result<IssueOutcome, IssueError>>;

/// One queued request and where its answer goes.
struct Queued {
    request: NewIssuance,
    answer: Answer,
}

/// The queues into the writer tasks, one per mode.
pub(super) struct Committer {
    upsert: mpsc::Sender<Queued>,
    atomic: mpsc::Sender<Queued>,
}

impl Committer {
    /// Starts the writer tasks for `issuer` (on the current runtime): `WRITERS` per mode.
    /// Each mode has its own, so that batches of one mode held up by the database (an
    /// atomic commit waiting for the majority, say) never make the other mode's requests
    /// wait for a writer; when one mode is used, the other's tasks only sleep.
    pub(super) fn start(issuer: Issuer) -> Self {
        Self {
            upsert: writers(&issuer, IssuanceMode::Upsert),
            atomic: writers(&issuer, IssuanceMode::Atomic),
        }
    }

    /// Queues `request` for the next batch of its mode and waits for its answer.
    pub(super) async fn submit(&self, request: NewIssuance) -> Result<IssueOutcome, IssueError> {
        let (answer, answered) = oneshot::channel();
        let gone =
            || IssueError::Store(StoreError::Internal("the batch writers stopped".to_owned()));
        let queue = match request.mode {
            IssuanceMode::Upsert => &self.upsert,
            IssuanceMode::Atomic => &self.atomic,
        };
        queue
            .send(Queued { request, answer })
            .await
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// Starts the writer tasks of `mode`; returns their queue.
fn writers(issuer: &Issuer, mode: IssuanceMode) -> mpsc::Sender<Queued> {
    let (queue, receiver) = mpsc::channel::<Queued>(QUEUE);
    let receiver = Arc::new(Mutex::new(receiver));
    for _ in 0..WRITERS {
        let (issuer, receiver) = (issuer.clone(), receiver.clone());
        tokio::spawn(async move {
            while let Some(batch) = next_batch(&receiver).await {
                match mode {
                    IssuanceMode::Upsert => issuer.commit_upserts(batch).await,
                    IssuanceMode::Atomic => issuer.commit_atomically(batch).await,
                }
            }
        });
    }
    queue
}

/// Waits for one request, then takes whatever else has queued, within the bounds.
async fn next_batch(receiver: &Mutex<mpsc::Receiver<Queued>>) -> Option<Vec<Queued>> {
    let mut receiver = receiver.lock().await;
    let first = receiver.recv().await?;
    let mut tokens = u64::from(first.request.params.quantity.get());
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH && tokens < MAX_BATCH_TOKENS {
        let Ok(next) = receiver.try_recv() else {
            break;
        };
        tokens += u64::from(next.request.params.quantity.get());
        batch.push(next);
    }
    metrics::histogram!(metric::ISSUANCE_BATCH_SIZE).record(batch.len() as f64);
    Some(batch)
}

/// Which requests a batch's payment read refuses: (position in the batch, refusal).
type Refusals = Vec<(usize, IssueError)>;

/// A batch's payments as read, by key (those tokenmint has heard of).
type Payments = HashMap<PaymentKey, PaymentDoc>;

/// A request whose record this batch inserted.
struct Claimed {
    request: NewIssuance,
    answer: Answer,
    record: IssuanceDoc,
}

/// A claim whose tokens are written, with their summaries.
type Written = (Claimed, Vec<TokenSummary>);

impl Issuer {
    /// Step 1: refuses what the payment's known state forbids, before writing anything.
    async fn admit(&self, batch: Vec<Queued>) -> Vec<Queued> {
        if batch.is_empty() {
            return batch;
        }
        match self.refusals(&batch).await {
            Ok((_, None)) => batch,
            Ok((_, Some(refused))) => answer_refused(batch, refused),
            Err(err) => {
                fail_all(batch.into_iter().map(|q| q.answer), &err);
                Vec::new()
            }
        }
    }

    /// The read of step 1: the payments, and the requests whose payment is known not to
    /// stand (`None` when every one may go on).
    async fn refusals(&self, batch: &[Queued]) -> Result<(Payments, Option<Refusals>), StoreError> {
        let keys: Vec<&PaymentKey> = batch.iter().map(|q| &q.request.key).collect();
        let payments = self.store.find_payments(&keys).await?;
        let refused: Refusals = batch
            .iter()
            .enumerate()
            .filter_map(|(i, q)| {
                refuse_unless_standing(payments.get(&q.request.key))
                    .err()
                    .map(|refusal| (i, refusal))
            })
            .collect();
        Ok((payments, (!refused.is_empty()).then_some(refused)))
    }

    /// Steps 1–6 in upsert mode.
    async fn commit_upserts(&self, batch: Vec<Queued>) {
        let admitted = self.admit(batch).await;
        let (claimed, replays) = self.claim_records(admitted).await;
        let writes = async {
            let (written, raced) = self.insert_tokens(claimed).await;
            self.settle_and_mark(written, None).await;
            // A concurrent replay or repair wrote some of these tokens: converge, one by one.
            join_all(raced.into_iter().map(|claim| async move {
                let outcome = self.complete(claim.record).await.map(IssueOutcome::Created);
                let _ = claim.answer.send(outcome);
            }))
            .await;
        };
        tokio::join!(writes, self.replay_batch(replays));
    }

    /// Step 2 (upsert mode): insert the records; a record that exists makes its request a
    /// replay.
    async fn claim_records(&self, upsert: Vec<Queued>) -> (Vec<Claimed>, Vec<Queued>) {
        let mut claimed = Vec::new();
        let mut replays = Vec::new();
        if upsert.is_empty() {
            return (claimed, replays);
        }
        let records: Vec<IssuanceDoc> = upsert
            .iter()
            .map(|q| IssuanceDoc::new(&q.request, IssuanceStatus::Issuing))
            .collect();
        let inserted = match self.store.insert_records(&records).await {
            Ok(inserted) => inserted,
            Err(err) => {
                fail_all(upsert.into_iter().map(|q| q.answer), &err);
                return (claimed, replays);
            }
        };
        for ((queued, record), result) in upsert.into_iter().zip(records).zip(inserted) {
            match result {
                RecordInsert::Inserted => claimed.push(Claimed {
                    request: queued.request,
                    answer: queued.answer,
                    record,
                }),
                RecordInsert::Exists => replays.push(queued),
                RecordInsert::Failed(err) => {
                    let _ = queued.answer.send(Err(err.into()));
                }
            }
        }
        (claimed, replays)
    }

    /// Step 3 (upsert mode): one insert of the claimed payments' tokens. Returns the sets
    /// written whole, and the claims whose set raced another writer.
    async fn insert_tokens(&self, claimed: Vec<Claimed>) -> (Vec<Written>, Vec<Claimed>) {
        let mut written = Vec::new();
        let mut raced = Vec::new();
        if claimed.is_empty() {
            return (written, raced);
        }
        let sets: Vec<&NewIssuance> = claimed.iter().map(|c| &c.request).collect();
        let results = match self.store.insert_token_sets(&sets).await {
            Ok(results) => results,
            Err(err) => {
                fail_all(claimed.into_iter().map(|c| c.answer), &err);
                return (written, raced);
            }
        };
        for (claim, result) in claimed.into_iter().zip(results) {
            match result {
                TokenInsert::Inserted(tokens) => written.push((claim, tokens)),
                TokenInsert::Raced => raced.push(claim),
                TokenInsert::Failed(err) => {
                    let _ = claim.answer.send(Err(err.into()));
                }
            }
        }
        (written, raced)
    }

    /// Steps 4 and 5: settle the written sets against their payments as they are now and
    /// mark the records `issued`, in parallel; answer. `known`: the payments as an atomic
    /// batch read them before its commit, which then stand for "now" (see the module's
    /// comment); otherwise they are read.
    ///
    /// Why the mark need not wait for the settle: the tokens are durable and complete, and
    /// a settle that does not happen after the mark (a crash, a failed read) is done by the
    /// sweep of recently withdrawn payments, which settles every payment taken back
    /// lately whatever its record's status. Marking in parallel takes one round trip off
    /// every issuance's latency.
    async fn settle_and_mark(&self, written: Vec<Written>, known: Option<Payments>) {
        if written.is_empty() {
            return;
        }
        let keys: Vec<&PaymentKey> = written.iter().map(|(c, _)| &c.request.key).collect();
        // Upsert-mode records were written `issuing`; atomic ones committed `issued`.
        let ids: Vec<_> = written
            .iter()
            .filter(|(c, _)| c.record.status == IssuanceStatus::Issuing)
            .map(|(c, _)| c.record.id)
            .collect();
        let payments = async {
            match known {
                Some(payments) => Ok(payments),
                None => self.store.find_payments(&keys).await,
            }
        };
        let (payments, marked) = tokio::join!(payments, self.store.mark_issued_many(&ids));
        // A lost mark costs nothing: the record, still `issuing`, is marked again by
        // self-repair.
        if let Err(err) = marked {
            tracing::warn!(error = %err, records = ids.len(), "cannot mark issued records; self-repair will");
        }
        let payments = match payments {
            Ok(payments) => payments,
            Err(err) => return fail_all(written.into_iter().map(|(c, _)| c.answer), &err),
        };
        for (mut claim, mut tokens) in written {
            let key = &claim.request.key;
            let settled = match self
                .settle_with(key, claim.record.quantity, payments.get(key))
                .await
            {
                // Tokens were revoked just now: answer with them as they are.
                Ok(settlement) if settlement.revoked > 0 => {
                    self.store.payment_tokens(key).await.map(|now| {
                        tokens = now;
                        settlement
                    })
                }
                other => other,
            };
            let answer = match settled {
                Err(err) => Err(IssueError::Store(err)),
                Ok(settlement) => match settlement.withdrawn {
                    Some(status) => Err(IssueError::PaymentNotSucceeded(status)),
                    None => {
                        claim.record.status = IssuanceStatus::Issued;
                        let created = claim.request.params.quantity.get();
                        Ok(IssueOutcome::Created(IssuedTokens {
                            issuance: claim.record,
                            tokens,
                            created,
                        }))
                    }
                },
            };
            let _ = claim.answer.send(answer);
        }
    }

    /// Step 6: requests whose payment had a record already.
    async fn replay_batch(&self, replays: Vec<Queued>) {
        if replays.is_empty() {
            return;
        }
        let keys: Vec<&PaymentKey> = replays.iter().map(|q| &q.request.key).collect();
        let (records, token_sets) = match tokio::try_join!(
            self.store.find_records(&keys),
            self.store.find_token_sets(&keys)
        ) {
            Ok(found) => found,
            Err(err) => return fail_all(replays.into_iter().map(|q| q.answer), &err),
        };
        let mut slow = Vec::new();
        for queued in replays {
            let record = records.get(&queued.request.key);
            let tokens = token_sets.get(&queued.request.key);
            match (record, tokens) {
                // The common replay: issued, complete. Verify and answer from the reads.
                (Some(record), Some(tokens))
                    if record.status == IssuanceStatus::Issued
                        && tokens.len() as i64 == record.quantity =>
                {
                    let answer = match record.params() {
                        Ok(params) => {
                            let mismatches = params.mismatches(&queued.request.params);
                            if mismatches.is_empty() {
                                Ok(IssueOutcome::Replayed(IssuedTokens {
                                    issuance: record.clone(),
                                    tokens: tokens.clone(),
                                    created: 0,
                                }))
                            } else {
                                Err(IssueError::Conflict(mismatches))
                            }
                        }
                        Err(err) => Err(err.into()),
                    };
                    let _ = queued.answer.send(answer);
                }
                _ => slow.push(queued),
            }
        }
        join_all(slow.into_iter().map(|queued| async move {
            let outcome = self.issue_alone(&queued.request).await;
            let _ = queued.answer.send(outcome);
        }))
        .await;
    }
}

/// Answers the refused requests; returns the others.
fn answer_refused(batch: Vec<Queued>, refused: Refusals) -> Vec<Queued> {
    let mut refusals: HashMap<usize, IssueError> = refused.into_iter().collect();
    let mut rest = Vec::with_capacity(batch.len());
    for (i, queued) in batch.into_iter().enumerate() {
        match refusals.remove(&i) {
            Some(refusal) => {
                let _ = queued.answer.send(Err(refusal));
            }
            None => rest.push(queued),
        }
    }
    rest
}

/// Answers every request of a command that failed as a whole with that failure.
fn fail_all(answers: impl IntoIterator<Item = Answer>, err: &StoreError) {
    for answer in answers {
        let _ = answer.send(Err(IssueError::Store(err.clone())));
    }
}
