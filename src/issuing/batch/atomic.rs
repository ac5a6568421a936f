//! Group commit in atomic mode: the batch's records and tokens in one transaction, so
//! each issuance still commits whole, while step 1 reads the payments; the records commit
//! as the read says (`issued`, or `issuing` where it shows a share to take back). A payment known
//! not to stand, or one whose place was taken already, aborts the transaction (which
//! leaves nothing) and the next one goes without those requests; then the settle and the
//! mark of the `issuing` ones (step 4), then the replays (step 5).

use std::collections::HashSet;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{Claimed, FirstRead, Queued, Refusals, Written, answer_refused, fail_all, refusals_of};
use crate::domain::{IssuanceStatus, PaymentKey};
use crate::issuing::Issuer;
use crate::issuing::standing::{share_written_revoked, takes_back};
use crate::store::TokensAck;
use crate::store::{
    AtomicPlan, AtomicSet, AtomicSetsInsert, IssuanceDoc, StoreError, TokenSummary, retry,
};

/// What one shared transaction left the batch with.
enum Transaction {
    /// Committed: these sets are written, for the settle.
    Committed(Vec<Written>),
    /// Not committed; these requests (refusals answered, replays set aside) try again.
    Retry(Vec<Queued>),
    /// Not committed, and every request answered with the failure.
    Failed,
    /// Not committed, and the requests left try one by one: the failure may have been
    /// one item's.
    OneByOne(Vec<Queued>),
}

impl Issuer {
    /// Steps 1–5 in atomic mode: the shared transactions, then the settle and mark of
    /// what they wrote, then the replays (those the batch named twice, those whose
    /// payment had a record, and those left over).
    pub(super) async fn commit_atomically(&self, batch: Vec<Queued>) {
        let (mut firsts, mut replays) = first_per_payment(batch);
        // Step 1 reads beside the first transaction only; later ones (fewer requests)
        // plan from the same read, which is also the settle's.
        let first_read = OnceCell::new();
        let mut written = Vec::new();
        for _ in 0..retry::ATOMIC_BATCH.max_attempts {
            if firsts.is_empty() {
                break;
            }
            match self.transaction(firsts, &mut replays, &first_read).await {
                Transaction::Committed(sets) => {
                    written = sets;
                    firsts = Vec::new();
                }
                Transaction::Retry(rest) => firsts = rest,
                Transaction::Failed => firsts = Vec::new(),
                Transaction::OneByOne(rest) => {
                    firsts = rest;
                    break;
                }
            }
        }
        // Left over: after an item's failure, or records that kept appearing and vanishing
        // (pending ones expiring) under the retries. Each takes the one-request path,
        // which reads the payment first.
        replays.append(&mut firsts);
        self.settle_and_mark(
            written,
            first_read.into_inner().unwrap_or_else(FirstRead::none),
            // The transaction's commit waited for the majority.
            TokensAck::Majority,
        )
        .await;
        self.replay_batch(replays).await;
    }

    /// One shared transaction of `firsts`' records and tokens, and what it leaves: the
    /// refused requests are answered, those whose payment's place was taken join
    /// `replays`, and a failure of the deployment answers them all.
    async fn transaction(
        &self,
        firsts: Vec<Queued>,
        replays: &mut Vec<Queued>,
        first_read: &OnceCell<FirstRead>,
    ) -> Transaction {
        let records: Vec<IssuanceDoc> = firsts
            .iter()
            .map(|q| IssuanceDoc::new(&q.request, IssuanceStatus::Issued))
            .collect();
        let sets: Vec<AtomicSet<'_>> = records
            .iter()
            .zip(&firsts)
            .map(|(record, q)| (record, &q.request))
            .collect();
        let plan = self.plan_records(&sets, first_read);
        match self.store.insert_sets_atomically(&sets, plan).await {
            Ok(AtomicSetsInsert::Committed(sets)) => Transaction::Committed(claims(firsts, sets)),
            Ok(AtomicSetsInsert::Refused(refused)) => {
                Transaction::Retry(answer_refused(firsts, refused))
            }
            Ok(AtomicSetsInsert::RecordExists) => {
                let (found, rest) = self.split_recorded(firsts).await;
                replays.extend(found);
                Transaction::Retry(rest)
            }
            // The deployment cannot take it (an outage, no transactions): every request
            // would be refused the same way on its own. So would a lone request whose
            // keys another transaction holds.
            Err(err @ (StoreError::Unavailable(_) | StoreError::TransactionsUnavailable)) => {
                fail_all(firsts.into_iter().map(|q| q.answer), &err);
                Transaction::Failed
            }
            Err(err @ StoreError::Contended(_)) if firsts.len() == 1 => {
                fail_all(firsts.into_iter().map(|q| q.answer), &err);
                Transaction::Failed
            }
            // Anything else may be one item's fault (a payment whose keys another
            // transaction holds, say, `Contended`): each request tries alone, so that it
            // fails only its own request.
            Err(err) => {
                tracing::warn!(error = %err, issuances = firsts.len(), "a shared atomic transaction failed; its issuances try one by one");
                Transaction::OneByOne(firsts)
            }
        }
    }

    /// A transaction's plan: step 1's read (made once per batch, on the first attempt),
    /// its refusals, and the records that commit `issuing`: those whose payment the read
    /// shows partly taken back, so that their settle, which comes after the commit, is
    /// never lost (until it is done, self-repair sees the record), each with the share
    /// its tokens commit revoked.
    async fn plan_records(
        &self,
        sets: &[AtomicSet<'_>],
        first_read: &OnceCell<FirstRead>,
    ) -> Result<AtomicPlan<Refusals>, StoreError> {
        let read = first_read
            .get_or_try_init(|| async {
                let at = Instant::now();
                let keys: Vec<&PaymentKey> = sets.iter().map(|(_, request)| &request.key).collect();
                let payments = self.store.find_payments(&keys).await?;
                Ok::<_, StoreError>(FirstRead { payments, at })
            })
            .await?;
        let requests = sets.iter().map(|(_, request)| *request);
        if let Some(refused) = refusals_of(requests, &read.payments) {
            return Ok(Err(refused));
        }
        Ok(Ok(sets
            .iter()
            .filter_map(|(record, request)| {
                let payment = read.payments.get(&request.key).filter(|p| takes_back(p))?;
                let quantity = i64::from(request.params.quantity.get());
                let share = share_written_revoked(&request.key, quantity, Some(payment), &[]);
                Some((record.id, share))
            })
            .collect()))
    }

    /// After a transaction ran into a record: the requests whose payment's place is taken
    /// now, by a record or a refund's placeholder (replays: the one-request path takes a
    /// placeholder over), and the rest. A failed read fails them all.
    async fn split_recorded(&self, batch: Vec<Queued>) -> (Vec<Queued>, Vec<Queued>) {
        let keys: Vec<&PaymentKey> = batch.iter().map(|q| &q.request.key).collect();
        match self.store.taken_places(&keys).await {
            Ok(taken) => batch
                .into_iter()
                .partition(|q| taken.contains(&q.request.key)),
            Err(err) => {
                fail_all(batch.into_iter().map(|q| q.answer), &err);
                (Vec::new(), Vec::new())
            }
        }
    }
}

/// Splits off the requests for a payment named earlier in the batch: one transaction
/// cannot hold two records of a payment, and the later requests are replays of the first.
fn first_per_payment(batch: Vec<Queued>) -> (Vec<Queued>, Vec<Queued>) {
    let mut seen = HashSet::new();
    batch
        .into_iter()
        .partition(|q| seen.insert(q.request.key.clone()))
}

/// The committed requests with their records and tokens, for the settle.
fn claims(batch: Vec<Queued>, sets: Vec<(IssuanceDoc, Vec<TokenSummary>)>) -> Vec<Written> {
    batch
        .into_iter()
        .zip(sets)
        .map(|(queued, (record, tokens))| {
            let claim = Claimed {
                request: queued.request,
                answer: queued.answer,
                record,
            };
            (claim, tokens)
        })
        .collect()
}
