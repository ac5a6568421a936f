//! Group commit: concurrent issuances share database commands.
//!
//! Requests queue, one queue per mode; writer tasks, as many at once as the mode's
//! `InFlight` allows (two, or as many as answer soonest up to
//! `issuance.max_batches_in_flight`), each take whatever has queued (at least one, at most
//! `MAX_BATCH`, no waiting for more: at low load a batch is one request and nothing is
//! added to its latency) and commit it with a fixed number of commands, whatever its
//! size, three of them dependent in upsert mode:
//! 1. one read of the batch's payments, sent together with step 2: a payment known failed,
//!    canceled or refunded is refused, and the record step 2 inserted for it taken back
//!    (`Store::take_back_unconfirmed`). This read is also the one every set is settled
//!    against;
//! 2. one `insert` of the records (status `issuing`, `unconfirmed` until step 4): a record
//!    that exists already makes its request a replay (step 5);
//! 3. once both answered, one `insert` of the standing payments' tokens, acknowledged by
//!    the primary alone on a replica set; the share the read shows taken back (a partial
//!    refund known before) is inserted revoked, so none of it is ever active;
//! 4. the settle: tokens the read of step 1 takes back are revoked (none left, unless a
//!    spend moved the share's boundary since); then one conditional update marks the
//!    records `issued` (`w: majority`), all but those a refund held meanwhile, which
//!    settle again on the one-request path; then the answers. The mark's majority makes
//!    steps 2–3 durable only if the same primary acknowledged it in the same term
//!    (`TokensAck`): after an election between them every set settles again on the
//!    one-request path, which answers only from what a majority read finds.
//! 5. replays, concurrently with 3–4: one read of their records and one of their tokens;
//!    a complete, matching, `issued` set is answered from those, anything else takes the
//!    one-request path (verify, complete with the upsert bulk, settle, take over a
//!    pending record).
//!
//! Why step 1's read is enough to settle against, though the records may be in before
//! it: a refund recorded after the read started holds the payment's place in `issuances`
//! after recording (`store::placeholder`), so after the read too. A hold before step 2
//! leaves a placeholder the record insert runs into (a replay, step 5); a hold after step
//! 2 marks the `issuing` record held, so step 4's mark leaves it and it is settled again
//! with a fresh read; a hold after the mark comes after the tokens, which the refund's
//! own revoke then sees. And the record stays `issuing` until its settle is done: a
//! settle that fails (or a process that dies) leaves it to self-repair, which settles it
//! however long ago the refund was.
//!
//! Why an `unconfirmed` record is safe to take back: no token is written for it until
//! the read says the payment stands, neither by its batch nor by anyone else, since every
//! other writer confirms a record before acting on it (`Issuer::complete`), and the
//! take-back leaves a confirmed record alone. A record a refund held is turned into that
//! refund's placeholder rather than deleted: the hold promised the place stays taken. A
//! read that fails leaves the records unconfirmed and answers 503: self-repair, or the
//! retry, confirms and finishes them against a fresh read.
//!
//! Atomic mode writes the batch's records and tokens in one transaction instead of steps
//! 2–3, so each issuance still commits whole; step 1's read runs while the transaction
//! writes, a refusal aborts it before commit, and the records commit as the read says:
//! `issued` when the payment stands whole, `issuing` when it shows a share to take back,
//! so that the settle of step 4 cannot be lost. A refund recorded after the read
//! holds the place too, which either waits for the commit (and then revokes the tokens)
//! or, by a placeholder, stops the transaction. A refused payment, or one whose place was
//! taken already, aborts the transaction, which leaves nothing: the next one goes without
//! those requests (replays, answered as in step 5 once the rest committed; a placeholder
//! is taken over on the one-request path).
//!
//! Each request's answer depends only on its own items' results: a failed item fails its
//! request alone, a token race sends its payment to the convergent upsert bulk, and a
//! command that fails as a whole fails the requests it carried (their records, if any,
//! stay `issuing` for self-repair; an aborted transaction left none). A shared transaction
//! that fails for another reason than an outage may have failed for one item: its
//! requests try one by one. A crash mid-batch leaves only `issuing` records (or none),
//! and `issued` ones that were settled.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

mod atomic;
mod in_flight;

use futures::FutureExt;
use futures::future::join_all;
use mongodb::bson::oid::ObjectId;
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use self::in_flight::{Admitted, InFlight};
use super::issue::{record_lost, refuse_other_params, refuse_unless_standing};
use super::standing::{share_written_revoked, takes_back};
use super::{IssueError, IssueOutcome, IssuedTokens, Issuer, Settlement};
use crate::domain::{IssuanceMode, IssuanceStatus, NewIssuance, PaymentKey};
use crate::store::{
    IssuanceDoc, PLACEHOLDER_LIFETIME, PaymentDoc, RecordInsert, RevokedShare, StoreError,
    TokenInsert, TokenSummary, TokensAck,
};
use crate::telemetry::{metric, traces};

/// Most requests per batch.
const MAX_BATCH: usize = 256;
/// Most tokens per batch: bounds the memory one batch holds (the store splits the insert
/// into commands within the server's limits); a single payment always fits.
const MAX_BATCH_TOKENS: u64 = 50_000;
/// Requests waiting beyond this make their senders wait for room (backpressure).
const QUEUE: usize = 4096;

type Answer = oneshot::Sender<Result<IssueOutcome, IssueError>>;

/// One queued request and where its answer goes.
struct Queued {
    request: NewIssuance,
    answer: Answer,
    /// The request's span, which the batch's span links to.
    span: tracing::Span,
    /// When it was queued, for `ISSUANCE_QUEUE_WAIT_SECONDS`.
    queued_at: Instant,
}

/// Group commit's writer tasks and the queues into them, one per mode. The application
/// owns them through its `Issuer`: `stop` closes the queues and waits for the writers,
/// which first answer everything queued before.
pub(super) struct Committer {
    /// `None` once `stop` closed them: the writers end when the last sender is gone.
    queues: RwLock<Option<Queues>>,
    /// Taken (and awaited) by `stop`.
    writers: Mutex<Vec<JoinHandle<()>>>,
}

/// The senders into the writer tasks, one per mode.
struct Queues {
    upsert: mpsc::Sender<Queued>,
    atomic: mpsc::Sender<Queued>,
}

impl Committer {
    /// Starts the writer tasks for `issuer` (on the current runtime): as many per mode as
    /// batches may be in flight at most, as many committing at once as the mode's
    /// `InFlight` allows.
    /// Each mode has its own, so that batches of one mode held up by the database (an
    /// atomic commit waiting for the majority, say) never make the other mode's requests
    /// wait for a writer; when one mode is used, the other's tasks only sleep.
    pub(super) fn start(issuer: &Issuer) -> Self {
        let mut writers = Vec::new();
        let queues = Queues {
            upsert: start_writers(issuer, IssuanceMode::Upsert, &mut writers),
            atomic: start_writers(issuer, IssuanceMode::Atomic, &mut writers),
        };
        Self {
            queues: RwLock::new(Some(queues)),
            writers: Mutex::new(writers),
        }
    }

    /// A committer that takes no requests: what stopping one that never started leaves.
    pub(super) fn stopped() -> Self {
        Self {
            queues: RwLock::new(None),
            writers: Mutex::new(Vec::new()),
        }
    }

    /// Queues `request` for the next batch of its mode and waits for its answer.
    pub(super) async fn submit(&self, request: NewIssuance) -> Result<IssueOutcome, IssueError> {
        let (answer, answered) = oneshot::channel();
        let gone =
            || IssueError::Store(StoreError::Internal("the batch writers stopped".to_owned()));
        // A sender of its own, so that no lock is held while the queue is full: `stop`
        // closing the queues meanwhile still lets this request in, and the writers
        // answer it before they end.
        let queue = {
            let queues = self.queues.read().unwrap_or_else(PoisonError::into_inner);
            let queues = queues.as_ref().ok_or_else(gone)?;
            match request.mode {
                IssuanceMode::Upsert => queues.upsert.clone(),
                IssuanceMode::Atomic => queues.atomic.clone(),
            }
        };
        queue
            .send(Queued {
                request,
                answer,
                span: tracing::Span::current(),
                queued_at: Instant::now(),
            })
            .await
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }

    /// Closes the queues, then waits for every writer to answer what was queued (the
    /// batches in flight and those still waiting) and end, for at most `within`. Returns
    /// how many writers ended; later issuances are refused.
    ///
    /// Past `within` (a database that hangs at shutdown) the writers are aborted: a batch
    /// cut off there is what a crash leaves, `issuing` records that self-repair completes
    /// and settles, while an unbounded wait would outlast the orchestrator's patience and
    /// cost the embedded mongod its clean stop.
    pub(super) async fn stop(&self, within: Duration) -> usize {
        drop(
            self.queues
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        end_writers(&self.writers, within, "issuance").await
    }
}

/// Waits for the writer tasks in `writers` to end, for at most `within`, then aborts
/// those still running; returns how many there were. `kind` names them in the log.
pub(super) async fn end_writers(
    writers: &Mutex<Vec<JoinHandle<()>>>,
    within: Duration,
    kind: &'static str,
) -> usize {
    let mut writers = std::mem::take(&mut *writers.lock().unwrap_or_else(PoisonError::into_inner));
    let stopped = writers.len();
    match tokio::time::timeout(within, join_all(writers.iter_mut())).await {
        Ok(ended) => {
            for err in ended.into_iter().filter_map(Result::err) {
                tracing::error!(error = %err, kind, "a batch writer ended abnormally");
            }
        }
        Err(_) => {
            tracing::warn!(
                writers = stopped,
                kind,
                "batch writers still writing at the end of the shutdown bound; aborted"
            );
            for writer in &writers {
                writer.abort();
            }
        }
    }
    stopped
}

/// Runs one batch's `commit`, so that a panic in it (a bug) ends that batch only, not its
/// writer: a writer gone would leave its mode with fewer until a restart, and with none,
/// refusing every request of it. The batch's requests, whose answers the panic dropped,
/// are answered 500; what it wrote is left as a crash leaves it, for self-repair and
/// retries to finish. `kind` names the writers in the log.
pub(super) async fn commit_surviving_panics(kind: &'static str, commit: impl Future<Output = ()>) {
    if let Err(panic) = AssertUnwindSafe(commit).catch_unwind().await {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(kind, panic = %message, "a batch panicked; its requests were answered 500");
    }
}

/// Starts the writer tasks of `mode`, their handles added to `writers`; returns their
/// queue. Each writer ends once the queue is closed and empty.
fn start_writers(
    issuer: &Issuer,
    mode: IssuanceMode,
    writers: &mut Vec<JoinHandle<()>>,
) -> mpsc::Sender<Queued> {
    let (queue, receiver) = mpsc::channel::<Queued>(QUEUE);
    let receiver = Arc::new(AsyncMutex::new(receiver));
    let in_flight = Arc::new(InFlight::new(mode, issuer.config.max_batches_in_flight));
    for _ in 0..in_flight.most() {
        let (issuer, receiver, in_flight) = (issuer.clone(), receiver.clone(), in_flight.clone());
        writers.push(tokio::spawn(async move {
            while let Some(Taken {
                batch,
                admitted,
                waited,
            }) = next_batch(&receiver, &in_flight, mode).await
            {
                let requests = batch.len();
                let started = Instant::now();
                // The batch's own span, its MongoDB commands inside it; it belongs to
                // no one request's trace, and links to each.
                let span = tracing::info_span!("batch", mode = mode.as_str(), size = requests);
                traces::link_to(&span, batch.iter().map(|queued| queued.span.clone()));
                let commit = async {
                    match mode {
                        IssuanceMode::Upsert => issuer.commit_upserts(batch).await,
                        IssuanceMode::Atomic => issuer.commit_atomically(batch).await,
                    }
                };
                commit_surviving_panics("issuance", commit.instrument(span)).await;
                let lived = waited + started.elapsed() * requests as u32;
                in_flight.finished(admitted, requests, lived);
            }
        }));
    }
    queue
}

/// A batch a writer took, with its admission and its requests' time in the queue, summed.
struct Taken<'a> {
    batch: Vec<Queued>,
    admitted: Admitted<'a>,
    waited: Duration,
}

/// Waits for one request and for room among the batches in flight, then takes whatever
/// else has queued, within the bounds.
async fn next_batch<'a>(
    receiver: &AsyncMutex<mpsc::Receiver<Queued>>,
    in_flight: &'a InFlight,
    mode: IssuanceMode,
) -> Option<Taken<'a>> {
    let mut receiver = receiver.lock().await;
    let first = receiver.recv().await?;
    // Admitted with the queue still held: what arrives while the batches in flight are
    // all the limit allows joins this one.
    let admitted = in_flight.admit().await;
    let mut tokens = u64::from(first.request.params.quantity.get());
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH && tokens < MAX_BATCH_TOKENS {
        let Ok(next) = receiver.try_recv() else {
            break;
        };
        tokens += u64::from(next.request.params.quantity.get());
        batch.push(next);
    }
    drop(receiver);
    metrics::histogram!(metric::ISSUANCE_BATCH_SIZE).record(batch.len() as f64);
    let histogram =
        metrics::histogram!(metric::ISSUANCE_QUEUE_WAIT_SECONDS, "mode" => mode.as_str());
    let taken_at = Instant::now();
    let mut waited = Duration::ZERO;
    for queued in &batch {
        let wait = taken_at.duration_since(queued.queued_at);
        histogram.record(wait.as_secs_f64());
        waited += wait;
    }
    Some(Taken {
        batch,
        admitted,
        waited,
    })
}

/// Which requests a batch's payment read refuses: (position in the batch, refusal).
type Refusals = Vec<(usize, IssueError)>;

/// A batch's payments as read, by key (those tokenmint has heard of).
type Payments = HashMap<PaymentKey, PaymentDoc>;

/// How long after step 1's read a batch may settle against it. Far below the
/// placeholder's lifetime: the argument needs what a refund's hold left after the read (a
/// placeholder, or a pending record it kept) to still be there when the batch inserts its
/// records. Past it, the settle reads the payments again.
const TRUST_FIRST_READ_FOR: Duration = Duration::from_secs(60);
const _: () = assert!(TRUST_FIRST_READ_FOR.as_secs() * 10 <= PLACEHOLDER_LIFETIME.as_secs());

/// Why step 4 left a record unmarked.
enum Unmarked {
    /// Still `issuing` (or put back): a refund held it, the mark failed, or an election
    /// came between the tokens and the mark.
    Held,
    /// Gone (its insert was rolled back by a failover), or not known to be there after an
    /// election: answered 503, nothing written.
    Lost,
}

/// Whether `payments` shows `key`'s payment taking tokens back.
fn payments_take_back(payments: &Payments, key: &PaymentKey) -> bool {
    payments.get(key).is_some_and(takes_back)
}

/// Step 1's read: the payments, and when they were read.
struct FirstRead {
    payments: Payments,
    at: Instant,
}

impl FirstRead {
    /// No read: what a batch that read nothing (and so wrote nothing) settles against.
    fn none() -> Self {
        Self {
            payments: Payments::new(),
            at: Instant::now(),
        }
    }
}

/// A request whose record this batch inserted.
struct Claimed {
    request: NewIssuance,
    answer: Answer,
    record: IssuanceDoc,
}

/// A claim whose tokens are written, with their summaries.
type Written = (Claimed, Vec<TokenSummary>);

impl Issuer {
    /// Steps 1–5 in upsert mode.
    async fn commit_upserts(&self, batch: Vec<Queued>) {
        let keys: Vec<PaymentKey> = batch.iter().map(|q| q.request.key.clone()).collect();
        let keys: Vec<&PaymentKey> = keys.iter().collect();
        let at = Instant::now();
        let (payments, (claimed, replays)) =
            tokio::join!(self.store.find_payments(&keys), self.claim_records(batch));
        let payments = match payments {
            Ok(payments) => payments,
            Err(err) => {
                // Not knowing whether the payments stand, nothing more is written nor
                // answered from: the records stay unconfirmed, for self-repair (or a
                // retry) to confirm and finish against a fresh read, and the replays are
                // not answered from sets their payment may no longer stand for.
                fail_all(claimed.into_iter().map(|c| c.answer), &err);
                return fail_all(replays.into_iter().map(|q| q.answer), &err);
            }
        };
        let (claimed, replays) = self
            .refuse_unless_standing(claimed, replays, &payments)
            .await;
        let first_read = FirstRead { payments, at };
        let writes = async {
            let (written, raced, ack) = self.insert_tokens(claimed, &first_read.payments).await;
            self.settle_and_mark(written, first_read, ack).await;
            // A concurrent replay or repair wrote some of these tokens: converge, one by one.
            // What the batch's insert wrote counts as this request's too.
            join_all(raced.into_iter().map(|(claim, inserted)| async move {
                let outcome = self.complete(claim.record).await.map(|mut set| {
                    set.created += inserted;
                    IssueOutcome::Created(set)
                });
                let _ = claim.answer.send(outcome);
            }))
            .await;
        };
        tokio::join!(writes, self.replay_batch(replays));
    }

    /// Step 2 (upsert mode): insert the records, `unconfirmed` while step 1's read is on
    /// its way; a record that exists makes its request a replay.
    async fn claim_records(&self, upsert: Vec<Queued>) -> (Vec<Claimed>, Vec<Queued>) {
        let mut claimed = Vec::new();
        let mut replays = Vec::new();
        if upsert.is_empty() {
            return (claimed, replays);
        }
        let records: Vec<IssuanceDoc> = upsert
            .iter()
            .map(|q| IssuanceDoc {
                unconfirmed: true,
                ..IssuanceDoc::new(&q.request, IssuanceStatus::Issuing)
            })
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

    /// After steps 1 and 2 (upsert mode): answers the requests (claims and replays) whose
    /// payment step 1's read shows not standing, taking the claims' records back first
    /// (`take_back_unconfirmed`: a retry answered before that could find the record and
    /// confirm it); returns the rest. When a record cannot be taken back (the command
    /// failed, a failover lost it, or a request that waited for it past its time
    /// confirmed it), the refusal is no longer the last word: a record may stay, which
    /// whoever finishes it (self-repair, a retry) settles against a fresh read. Then every
    /// refused request of the batch hears 503, and its retry answers from what stands.
    async fn refuse_unless_standing(
        &self,
        claimed: Vec<Claimed>,
        replays: Vec<Queued>,
        payments: &Payments,
    ) -> (Vec<Claimed>, Vec<Queued>) {
        let refusal = |key: &PaymentKey| refuse_unless_standing(payments.get(key)).err();
        let mut standing = Vec::with_capacity(claimed.len());
        let mut refused = Vec::new();
        for claim in claimed {
            match refusal(&claim.request.key) {
                Some(err) => refused.push((claim, err)),
                None => standing.push(claim),
            }
        }
        let mut standing_replays = Vec::with_capacity(replays.len());
        // Refused replays (of a record this batch inserted, among others) are answered
        // after the take-back, as the claims are: no 409 while the record may stay.
        let mut refused_answers: Vec<(Answer, IssueError)> = Vec::new();
        for queued in replays {
            match refusal(&queued.request.key) {
                Some(err) => refused_answers.push((queued.answer, err)),
                None => standing_replays.push(queued),
            }
        }
        let mut kept = None;
        if !refused.is_empty() {
            let ids: Vec<ObjectId> = refused.iter().map(|(c, _)| c.record.id).collect();
            kept = match self.store.take_back_unconfirmed(&ids).await {
                Ok(taken_back) if taken_back == ids.len() as u64 => None,
                Ok(_) => Some(StoreError::unavailable(
                    "a record of a payment that does not stand was not taken back: \
                     another request confirmed it, or a failover lost it",
                )),
                Err(err) => Some(err),
            };
            if let Some(err) = &kept {
                tracing::warn!(error = %err, records = ?ids, "cannot take back the records of payments that do not stand");
            }
            refused_answers.extend(refused.into_iter().map(|(claim, err)| (claim.answer, err)));
        }
        for (answer, refusal) in refused_answers {
            let refusal = match &kept {
                None => refusal,
                Some(err) => IssueError::Store(err.clone()),
            };
            let _ = answer.send(Err(refusal));
        }
        (standing, standing_replays)
    }

    /// Step 3 (upsert mode): one insert of the claimed payments' tokens, the share step
    /// 1's read shows taken back written revoked. Returns the sets written whole, the
    /// claims whose set raced another writer (with how many of its tokens the insert
    /// wrote), and how the insert was acknowledged (which step 4's mark must cover before
    /// any set is answered).
    async fn insert_tokens(
        &self,
        claimed: Vec<Claimed>,
        payments: &Payments,
    ) -> (Vec<Written>, Vec<(Claimed, u32)>, TokensAck) {
        let mut written = Vec::new();
        let mut raced = Vec::new();
        if claimed.is_empty() {
            return (written, raced, TokensAck::Majority);
        }
        let sets: Vec<(&NewIssuance, Option<RevokedShare>)> = claimed
            .iter()
            .map(|c| {
                let quantity = i64::from(c.request.params.quantity.get());
                let payment = payments.get(&c.request.key);
                let share = share_written_revoked(&c.request.key, quantity, payment, &[]);
                (&c.request, share)
            })
            .collect();
        let (results, ack) = match self.store.insert_token_sets(&sets).await {
            Ok(inserted) => inserted,
            Err(err) => {
                fail_all(claimed.into_iter().map(|c| c.answer), &err);
                return (written, raced, TokensAck::Majority);
            }
        };
        for (claim, result) in claimed.into_iter().zip(results) {
            match result {
                TokenInsert::Inserted(tokens) => written.push((claim, tokens)),
                TokenInsert::Raced { inserted } => raced.push((claim, inserted)),
                TokenInsert::Failed(err) => {
                    let _ = claim.answer.send(Err(err.into()));
                }
            }
        }
        (written, raced, ack)
    }

    /// Step 4: settle the written sets against step 1's read, mark the settled `issuing`
    /// records `issued` (but those a refund held meanwhile, which settle again on the
    /// one-request path), answer. Past the read's trust window the payments are read
    /// again. A set whose settle fails is answered with the failure and its record stays
    /// `issuing`, for self-repair (atomic sets whose read showed nothing to take back
    /// committed `issued`: a refund after the read settles them itself).
    async fn settle_and_mark(&self, written: Vec<Written>, first_read: FirstRead, ack: TokensAck) {
        if written.is_empty() {
            return;
        }
        let payments = if first_read.at.elapsed() < TRUST_FIRST_READ_FOR {
            first_read.payments
        } else {
            let keys: Vec<&PaymentKey> = written.iter().map(|(c, _)| &c.request.key).collect();
            match self.store.find_payments(&keys).await {
                Ok(payments) => payments,
                Err(err) => return fail_all(written.into_iter().map(|(c, _)| c.answer), &err),
            }
        };
        let settled = join_all(written.into_iter().map(|(claim, tokens)| {
            let payment = payments.get(&claim.request.key);
            async move {
                let settled = self
                    .settle_with(&claim.request.key, claim.record.quantity, payment)
                    .await;
                (claim, tokens, settled)
            }
        }))
        .await;
        let mut answered = Vec::with_capacity(settled.len());
        for (claim, tokens, settled) in settled {
            match settled {
                Ok(settlement) => answered.push((claim, tokens, settlement)),
                Err(err) => {
                    let _ = claim.answer.send(Err(IssueError::Store(err)));
                }
            }
        }
        let unmarked = self.mark_unless_held(&answered, &ack).await;
        let (unmarked, payments) = (&unmarked, &payments);
        join_all(
            answered
                .into_iter()
                .map(|(mut claim, tokens, settlement)| async move {
                    let key = &claim.request.key;
                    let created = claim.request.params.quantity.get();
                    match unmarked.get(&claim.record.id) {
                        // A refund may have held the place while these tokens were written:
                        // settle with the payment as it is now (and mark), before answering.
                        Some(Unmarked::Held) => {
                            let outcome = self.complete(claim.record).await.map(|mut set| {
                                set.created = created;
                                IssueOutcome::Created(set)
                            });
                            let _ = claim.answer.send(outcome);
                            return;
                        }
                        // The record is gone (a failover rolled back its insert): nothing is
                        // acknowledged; a retry records it again and converges on the tokens.
                        Some(Unmarked::Lost) => {
                            let _ = claim.answer.send(Err(IssueError::Store(record_lost())));
                            return;
                        }
                        None => {}
                    }
                    // The read took tokens back (here, or someone else just did): answer with
                    // the tokens as they are.
                    let tokens = if settlement.revoked > 0 || payments_take_back(payments, key) {
                        self.store.payment_tokens(key).await
                    } else {
                        Ok(tokens)
                    };
                    let answer = match (tokens, settlement.withdrawn) {
                        (Err(err), _) => Err(IssueError::Store(err)),
                        (Ok(_), Some(status)) => Err(IssueError::PaymentNotSucceeded(status)),
                        (Ok(tokens), None) => {
                            claim.record.status = IssuanceStatus::Issued;
                            claim.record.unconfirmed = false;
                            Ok(IssueOutcome::Created(IssuedTokens {
                                issuance: claim.record,
                                tokens,
                                created,
                            }))
                        }
                    };
                    let _ = claim.answer.send(answer);
                }),
        )
        .await;
    }

    /// Marks the settled `issuing` records `issued`, but those a refund held meanwhile;
    /// returns the ones it did not mark, and why. When the mark or the read after it
    /// fails, every record counts as held: each is settled again on the one-request path
    /// (which fails too in an outage, leaving the record `issuing` for self-repair), so
    /// that no set a refund may have held is answered unsettled.
    ///
    /// So does every set when the mark's majority does not cover the tokens (an election
    /// came between them, `TokensAck::covered_by`): the mark may stand on a primary that
    /// never had them. The records go back to `issuing` first (also when the mark failed
    /// after tokens the primary alone acknowledged: it may have been applied), so that a
    /// set whose settling again fails, or a process that dies now, leaves them to
    /// self-repair rather than `issued` over missing tokens; a record the election lost,
    /// or every record when the read that tells fails, answers 503 without writing its
    /// tokens again. The one-request path answers only from tokens a majority read finds,
    /// writing again any that are missing.
    async fn mark_unless_held(
        &self,
        settled: &[(Claimed, Vec<TokenSummary>, Settlement)],
        ack: &TokensAck,
    ) -> HashMap<ObjectId, Unmarked> {
        let ids: Vec<ObjectId> = settled
            .iter()
            .filter(|(c, _, _)| c.record.status == IssuanceStatus::Issuing)
            .map(|(c, _, _)| c.record.id)
            .collect();
        if ids.is_empty() {
            return HashMap::new();
        }
        let all_held = || ids.iter().map(|id| (*id, Unmarked::Held)).collect();
        let primary_alone = matches!(ack, TokensAck::Primary(_));
        let marked = match self.store.mark_settled(&ids).await {
            Ok(marked) => marked,
            Err(err) => {
                tracing::warn!(error = %err, records = ids.len(), "cannot mark issued records; settling them again");
                // A mark applied in a later term whose answer was lost may stand over
                // missing tokens as well.
                if primary_alone {
                    self.reopen(&ids).await;
                }
                return all_held();
            }
        };
        let covered = ack.covered_by(marked.at.as_ref());
        if !covered {
            metrics::counter!(metric::BATCH_TERM_CHANGES_TOTAL).increment(1);
            tracing::warn!(
                records = ids.len(),
                "an election came between a batch's token insert and its mark; settling its sets again"
            );
            self.reopen(&ids).await;
        } else if marked.modified == ids.len() as u64 {
            return HashMap::new();
        }
        match self.store.records_by_id(&ids).await {
            Ok(records) => {
                let now: HashMap<ObjectId, IssuanceStatus> =
                    records.into_iter().map(|r| (r.id, r.status)).collect();
                ids.iter()
                    .filter_map(|id| match now.get(id) {
                        // Marked, by this update or by a replay that settled it first.
                        Some(IssuanceStatus::Issued) if covered => None,
                        Some(_) => Some((*id, Unmarked::Held)),
                        None => Some((*id, Unmarked::Lost)),
                    })
                    .collect()
            }
            // Not knowing which records the election kept, none is settled again: the
            // one-request path would write tokens for a record that may be gone (or that
            // another request's record replaced). Answered 503; self-repair finishes the
            // records that are there.
            Err(err) if !covered => {
                tracing::warn!(error = %err, "cannot tell which records an election kept");
                ids.iter().map(|id| (*id, Unmarked::Lost)).collect()
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot tell which records a refund held; settling them again");
                all_held()
            }
        }
    }

    /// `Store::reopen_records`, whose failure is only told: the sets are settled again
    /// whatever it did.
    async fn reopen(&self, ids: &[ObjectId]) {
        if let Err(err) = self.store.reopen_records(ids).await {
            tracing::warn!(error = %err, records = ?ids, "cannot put the records back to issuing");
        }
    }

    /// Step 5: requests whose payment had a record already.
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
                    let answer = record
                        .params()
                        .map_err(IssueError::from)
                        .and_then(|params| refuse_other_params(&params, &queued.request.params))
                        .map(|()| {
                            IssueOutcome::Replayed(IssuedTokens {
                                issuance: record.clone(),
                                tokens: tokens.clone(),
                                created: 0,
                            })
                        });
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

/// The requests whose payment is known not to stand, by `payments`: (position, refusal).
fn refusals_of<'a>(
    requests: impl Iterator<Item = &'a NewIssuance>,
    payments: &Payments,
) -> Option<Refusals> {
    let refused: Refusals = requests
        .enumerate()
        .filter_map(|(i, request)| {
            refuse_unless_standing(payments.get(&request.key))
                .err()
                .map(|refusal| (i, refusal))
        })
        .collect();
    (!refused.is_empty()).then_some(refused)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_batch_ends_alone_and_its_requests_hear_so() {
        let (answer, answered) = oneshot::channel::<()>();
        commit_surviving_panics("test", async move {
            let _answer = answer;
            panic!("a bug in one batch");
        })
        .await;
        assert!(
            answered.await.is_err(),
            "the batch's answers are dropped: its requests are told the writers stopped"
        );
        let mut next_batch_ran = false;
        commit_surviving_panics("test", async { next_batch_ran = true }).await;
        assert!(next_batch_ran, "the writer goes on with its next batch");
    }
}
