//! Group commit for redemptions: concurrent redemptions of different owners share one
//! transaction.
//!
//! A redemption's transaction costs the database more per command than its few
//! documents do (each command in a transaction checks out the session, and the commit
//! waits for the majority and the journal), so redemptions arriving together are
//! committed together: one read of each owner's oldest tokens, then ONE `update` of all
//! the chosen tokens, ONE `insert` of all the records and ONE commit, whatever the
//! batch's size (`Store::redeem_in_transaction`).
//!
//! - Each owner's redemptions go to one writer task (by a hash of the owner), and a
//!   batch takes at most one redemption per owner: two redemptions of one owner would
//!   choose the same oldest tokens. The others wait, in order, for the writer's next
//!   batch, which reads what this one redeemed.
//! - A writer takes whatever has queued, without waiting for more: at low load a batch
//!   is one redemption, and nothing is added to its latency.
//! - All or nothing, per batch: the batch commits whole, or nothing of it is written
//!   (when its commit's outcome stays unknown, the retries below find out which).
//!   When it cannot commit (one token taken by a refund's revoke or a single redeem
//!   since the read, a reference used meanwhile, or any other failure of one of its
//!   commands), every redemption of it is told `Conflict` and tries again alone
//!   (`Issuer::redeem_amount`), so that one contended owner or one bad request costs the
//!   others one retry, not their answer. A refusal (too few tokens) rests on the
//!   transaction's snapshot read, and stands only when the transaction commits (an empty
//!   one, when nothing else is written): the commit waits for the majority to have what
//!   the snapshot showed. When the rest conflicts, the refused one tries again alone too.
//! - A redemption whose request is gone by the time its batch forms (it timed out, or
//!   the client went away, while it waited) is left out: nothing is written for a
//!   request nobody will be answered for.
//! - Redemptions under an `Idempotency-Key` commit alone: their key's answer commits
//!   in their transaction, and a key taken over must not cost a batch.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Duration;

use mongodb::bson::oid::ObjectId;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::plan;
use crate::domain::NewRedemption;
use crate::issuing::Issuer;
use crate::issuing::batch::{commit_surviving_panics, end_writers};
use crate::store::{RedemptionAttempt, Spend, Spendable, StoreError};
use crate::telemetry::{metric, traces};

/// Writer tasks, each with the owners its hash gives it: a batch's reads run one after
/// another in its transaction, so a writer has one batch in flight; four keep the
/// database busy (measured at concurrency 32: two reached 0.40× the issuance rate where
/// four reached 0.42–0.47×).
const WRITERS: usize = 4;
/// Most redemptions per batch.
const MAX_BATCH: usize = 64;
/// Most tokens per batch: bounds how long one transaction holds its tokens and how large
/// its `update` is; a single redemption always fits.
const MAX_BATCH_TOKENS: u64 = 50_000;
/// Redemptions waiting for a writer beyond this make their senders wait (backpressure).
const QUEUE: usize = 4096;

/// What one redemption's attempt in a batch came to.
pub(super) type Attempted = Result<RedemptionAttempt<u64>, StoreError>;

/// One queued redemption and where its attempt's outcome goes.
struct Queued {
    request: NewRedemption,
    /// The id its record is written with.
    record: ObjectId,
    spendable: Spendable,
    answer: oneshot::Sender<Attempted>,
    /// The request's span, which the batch's span links to.
    span: tracing::Span,
}

/// The redemption writers and the queues into them. The application owns them through
/// its `Issuer`: `stop` closes the queues and waits for the writers, which first commit
/// everything queued before.
pub(in crate::issuing) struct Spender {
    /// One queue per writer; `None` once `stop` closed them.
    queues: RwLock<Option<Vec<mpsc::Sender<Queued>>>>,
    writers: Mutex<Vec<JoinHandle<()>>>,
}

impl Spender {
    /// Starts the writer tasks for `issuer` (on the current runtime).
    pub(in crate::issuing) fn start(issuer: &Issuer) -> Self {
        let mut queues = Vec::with_capacity(WRITERS);
        let mut writers = Vec::with_capacity(WRITERS);
        for _ in 0..WRITERS {
            let (queue, receiver) = mpsc::channel(QUEUE);
            queues.push(queue);
            writers.push(tokio::spawn(write(issuer.clone(), receiver)));
        }
        Self {
            queues: RwLock::new(Some(queues)),
            writers: Mutex::new(writers),
        }
    }

    /// A spender that takes no redemptions: what stopping one that never started leaves.
    pub(in crate::issuing) fn stopped() -> Self {
        Self {
            queues: RwLock::new(None),
            writers: Mutex::new(Vec::new()),
        }
    }

    /// Queues `request` for its owner's writer and waits for its attempt's outcome.
    pub(super) async fn attempt(
        &self,
        request: &NewRedemption,
        record: ObjectId,
        spendable: &Spendable,
    ) -> Attempted {
        let (answer, answered) = oneshot::channel();
        let gone = || StoreError::Internal("the redemption writers stopped".to_owned());
        // A sender of its own, so that no lock is held while the queue is full.
        let queue = {
            let queues = self.queues.read().unwrap_or_else(PoisonError::into_inner);
            let queues = queues.as_ref().ok_or_else(gone)?;
            queues[writer_of(request, queues.len())].clone()
        };
        queue
            .send(Queued {
                request: request.clone(),
                record,
                spendable: spendable.clone(),
                answer,
                span: tracing::Span::current(),
            })
            .await
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }

    /// Closes the queues, then waits for every writer to commit what was queued and end,
    /// for at most `within` (then aborts them: a batch cut off there leaves nothing, as
    /// its transaction never commits). Returns how many writers ended.
    pub(in crate::issuing) async fn stop(&self, within: Duration) -> usize {
        drop(
            self.queues
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        end_writers(&self.writers, within, "redemption").await
    }
}

/// The writer of `request`'s owner, among `writers`.
fn writer_of(request: &NewRedemption, writers: usize) -> usize {
    let mut hasher = DefaultHasher::new();
    request.owner.object_id().hash(&mut hasher);
    (hasher.finish() % writers as u64) as usize
}

/// A writer: commits batches from its queue until the queue is closed and everything
/// queued is answered.
async fn write(issuer: Issuer, mut receiver: mpsc::Receiver<Queued>) {
    let mut waiting: VecDeque<Queued> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            let Some(first) = receiver.recv().await else {
                return;
            };
            waiting.push_back(first);
        }
        while waiting.len() < QUEUE {
            let Ok(next) = receiver.try_recv() else {
                break;
            };
            waiting.push_back(next);
        }
        let batch = next_batch(&mut waiting);
        if batch.is_empty() {
            continue;
        }
        let span = tracing::info_span!("redemption_batch", size = batch.len());
        traces::link_to(&span, batch.iter().map(|queued| queued.span.clone()));
        let commit = issuer.commit_redemptions(batch).instrument(span);
        commit_surviving_panics("redemption", commit).await;
    }
}

/// Takes from `waiting`, in order, the first redemption of each owner, up to
/// `MAX_BATCH` and `MAX_BATCH_TOKENS` (at least one); the rest keep their order for the
/// next batch. Redemptions whose request is gone are dropped.
fn next_batch(waiting: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut owners = HashSet::new();
    let mut tokens = 0;
    let mut batch = Vec::new();
    let mut later = VecDeque::new();
    while let Some(queued) = waiting.pop_front() {
        if queued.answer.is_closed() {
            continue;
        }
        let quantity = u64::from(queued.request.quantity.get());
        let fits =
            batch.is_empty() || (batch.len() < MAX_BATCH && tokens + quantity <= MAX_BATCH_TOKENS);
        // An owner's first redemption that does not fit keeps its owner's later ones
        // out too: they go in the order they came.
        if owners.insert(queued.request.owner) && fits {
            tokens += quantity;
            batch.push(queued);
        } else {
            later.push_back(queued);
        }
    }
    *waiting = later;
    if !batch.is_empty() {
        metrics::histogram!(metric::REDEMPTION_BATCH_SIZE).record(batch.len() as f64);
    }
    batch
}

impl Issuer {
    /// One transaction for `batch`, each redemption answered with its own attempt. A
    /// failure of a batch of several is each one's `Conflict`: which redemption it was
    /// due to, if any, its retry alone tells.
    async fn commit_redemptions(&self, batch: Vec<Queued>) {
        let spends: Vec<Spend<'_>> = batch
            .iter()
            .map(|queued| Spend {
                owner: queued.request.owner.object_id(),
                reference: queued.request.reference.as_str(),
                spendable: &queued.spendable,
                answered: None,
            })
            .collect();
        let attempts = self
            .store
            .redeem_in_transaction(&spends, |index, found| {
                plan(&batch[index].request, batch[index].record, found)
            })
            .await;
        match attempts {
            Ok(attempts) => {
                for (queued, attempt) in batch.into_iter().zip(attempts) {
                    let _ = queued.answer.send(Ok(attempt));
                }
            }
            Err(err) if batch.len() > 1 => {
                tracing::warn!(error = %err, size = batch.len(), "a redemption batch failed; its redemptions try alone");
                for queued in batch {
                    let _ = queued.answer.send(Ok(RedemptionAttempt::Conflict));
                }
            }
            Err(err) => {
                for queued in batch {
                    let _ = queued.answer.send(Err(err.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Actor, Owner, Quantity, RedemptionReference, TokenType};

    /// A queued redemption of `quantity`, and the receiver of its answer.
    fn queued_of(
        owner: ObjectId,
        reference: &str,
        quantity: i64,
    ) -> (Queued, oneshot::Receiver<Attempted>) {
        let request = NewRedemption {
            owner: Owner::from_object_id(owner),
            token_type: TokenType::parse("standard").unwrap(),
            quantity: Quantity::from_i64(quantity, 100_000).unwrap(),
            reference: RedemptionReference::parse(reference).unwrap(),
            account_id: None,
            requested_by: Actor::api_key("k"),
        };
        let spendable = super::super::spendable(&request, None);
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            request,
            record: ObjectId::new(),
            spendable,
            answer,
            span: tracing::Span::none(),
        };
        (queued, answered)
    }

    fn references(batch: &[Queued]) -> Vec<&str> {
        batch.iter().map(|q| q.request.reference.as_str()).collect()
    }

    #[test]
    fn a_batch_takes_one_redemption_per_owner_and_leaves_the_rest_in_order() {
        let (a, b) = (ObjectId::new(), ObjectId::new());
        let asked = [(a, "a1"), (a, "a2"), (b, "b1"), (a, "a3"), (b, "b2")];
        let (mut waiting, _answers): (VecDeque<Queued>, Vec<_>) = asked
            .iter()
            .map(|(owner, reference)| queued_of(*owner, reference, 1))
            .unzip();
        assert_eq!(references(&next_batch(&mut waiting)), ["a1", "b1"]);
        assert_eq!(references(&next_batch(&mut waiting)), ["a2", "b2"]);
        assert_eq!(references(&next_batch(&mut waiting)), ["a3"]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_redemptions_and_max_batch_tokens() {
        let (mut waiting, _answers): (VecDeque<Queued>, Vec<_>) = (0..MAX_BATCH + 3)
            .map(|i| queued_of(ObjectId::new(), &format!("r{i}"), 1))
            .unzip();
        assert_eq!(next_batch(&mut waiting).len(), MAX_BATCH);
        assert_eq!(next_batch(&mut waiting).len(), 3);

        let large = MAX_BATCH_TOKENS as i64 / 2;
        let (mut waiting, _answers): (VecDeque<Queued>, Vec<_>) = (0..3)
            .map(|i| queued_of(ObjectId::new(), &format!("l{i}"), large + 1))
            .unzip();
        assert_eq!(next_batch(&mut waiting).len(), 1);
        assert_eq!(next_batch(&mut waiting).len(), 1, "one always fits");
        assert_eq!(next_batch(&mut waiting).len(), 1);
    }

    #[test]
    fn an_owners_redemption_that_does_not_fit_keeps_its_later_ones_behind_it() {
        let (x, a) = (ObjectId::new(), ObjectId::new());
        let large = MAX_BATCH_TOKENS as i64 - 10;
        let asked = [(x, "x", large), (a, "a1", 20), (a, "a2", 5)];
        let (mut waiting, _answers): (VecDeque<Queued>, Vec<_>) = asked
            .iter()
            .map(|(owner, reference, quantity)| queued_of(*owner, reference, *quantity))
            .unzip();
        assert_eq!(references(&next_batch(&mut waiting)), ["x"]);
        assert_eq!(references(&next_batch(&mut waiting)), ["a1"]);
        assert_eq!(references(&next_batch(&mut waiting)), ["a2"]);
    }

    #[test]
    fn a_redemption_whose_request_is_gone_is_left_out() {
        let (gone, answered) = queued_of(ObjectId::new(), "gone", 1);
        drop(answered);
        let (waiting_one, _answered) = queued_of(ObjectId::new(), "waiting", 1);
        let mut waiting: VecDeque<Queued> = [gone, waiting_one].into();
        assert_eq!(references(&next_batch(&mut waiting)), ["waiting"]);
        assert!(waiting.is_empty());
    }
}
