//! Group commit in atomic mode: the batch's records (`issued`) and all their tokens in one
//! transaction, so each issuance still commits whole, while step 1 reads the payments.
//! A payment known not to stand, or one that had a record already, aborts the transaction
//! (which leaves nothing) and the next one goes without those requests; then the settle
//! (step 4, no mark), then the replays (step 6).

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::{Claimed, Payments, Queued, Written, answer_refused, fail_all};
use crate::domain::{IssuanceStatus, PaymentKey};
use crate::issuing::Issuer;
use crate::store::{
    AtomicSet, AtomicSetsInsert, IssuanceDoc, PLACEHOLDER_LIFETIME, StoreError, TokenSummary,
};

/// How long after the first read a batch that committed may settle against it. Far below
/// the placeholder's lifetime: the argument needs what a refund's hold left after the
/// read (a placeholder, or a pending record it kept) to still be there when the
/// transaction inserts its records.
const TRUST_FIRST_READ_FOR: Duration = Duration::from_secs(60);
const _: () = assert!(TRUST_FIRST_READ_FOR.as_secs() * 10 <= PLACEHOLDER_LIFETIME.as_secs());

/// Transactions per batch: one that the payments' state refuses, or that runs into an
/// existing record (then a read finds which), is followed by one without those requests,
/// so the third normally commits.
const MAX_ATTEMPTS: usize = 4;

impl Issuer {
    pub(super) async fn commit_atomically(&self, batch: Vec<Queued>) {
        let (mut firsts, mut replays) = first_per_payment(batch);
        let mut written = Vec::new();
        // Step 1 runs beside the first transaction only. Its read is also the settle's
        // (no second read): a refund recorded after it holds the payment's place before
        // revoking, which either waits for this batch's commit or stops it, whatever the
        // attempt (`store::placeholder`).
        let started = Instant::now();
        let mut payments_read = false;
        let mut first_read: Option<Payments> = None;
        for _ in 0..MAX_ATTEMPTS {
            if firsts.is_empty() {
                break;
            }
            let records: Vec<IssuanceDoc> = firsts
                .iter()
                .map(|q| IssuanceDoc::new(&q.request, IssuanceStatus::Issued))
                .collect();
            let sets: Vec<AtomicSet<'_>> = records
                .iter()
                .zip(&firsts)
                .map(|(record, q)| (record, &q.request))
                .collect();
            let refusals = async {
                if std::mem::replace(&mut payments_read, true) {
                    return Ok(None);
                }
                let (payments, refused) = self.refusals(&firsts).await?;
                first_read = Some(payments);
                Ok(refused)
            };
            match self
                .store
                .insert_sets_atomically_unless(&sets, refusals)
                .await
            {
                Ok(AtomicSetsInsert::Committed(token_sets)) => {
                    written = claims(std::mem::take(&mut firsts), records, token_sets);
                }
                Ok(AtomicSetsInsert::Refused(refused)) => {
                    firsts = answer_refused(firsts, refused);
                }
                Ok(AtomicSetsInsert::RecordExists) => {
                    let (found, rest) = self.split_recorded(firsts).await;
                    replays.extend(found);
                    firsts = rest;
                }
                // The deployment cannot take it (an outage, no transactions): every
                // request would be refused the same way on its own.
                Err(err @ (StoreError::Unavailable(_) | StoreError::TransactionsUnavailable)) => {
                    fail_all(firsts.drain(..).map(|q| q.answer), &err);
                }
                // Anything else may be one item's fault: each request tries alone, so
                // that it fails only its own request.
                Err(err) => {
                    tracing::warn!(error = %err, issuances = firsts.len(), "a shared atomic transaction failed; its issuances try one by one");
                    break;
                }
            }
        }
        // Left over: after an item's failure, or records that kept appearing and vanishing
        // (pending ones expiring) under the retries. Each takes the one-request path,
        // which reads the payment first.
        replays.append(&mut firsts);
        // A placeholder outlives any read trusted this long; past it, read again.
        let known = first_read.filter(|_| started.elapsed() < TRUST_FIRST_READ_FOR);
        self.settle_and_mark(written, known).await;
        self.replay_batch(replays).await;
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
fn claims(
    batch: Vec<Queued>,
    records: Vec<IssuanceDoc>,
    token_sets: Vec<Vec<TokenSummary>>,
) -> Vec<Written> {
    batch
        .into_iter()
        .zip(records)
        .zip(token_sets)
        .map(|((queued, record), tokens)| {
            let claim = Claimed {
                request: queued.request,
                answer: queued.answer,
                record,
            };
            (claim, tokens)
        })
        .collect()
}
