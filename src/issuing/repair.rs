//! Self-repair: a payment whose record says `issuing` for longer than a request could
//! take was left short by a crash, a timeout or a lost connection between two writes.
//! Every instance runs the same sweep; each record is leased to one repairer at a time,
//! and finishing it is idempotent anyway (the upsert bulk, the settle, the conditional
//! mark), so instances repairing at once, or a repairer racing the client's own retry,
//! cannot write a token twice.

use std::time::Duration;

use mongodb::bson::{Bson, DateTime};

use super::{IssueError, Issuer, Settlement};
use crate::domain::PaymentKey;
use crate::store::{LeaseAttempt, StoreError};
use crate::telemetry::metric;

/// How long a repairer holds a record before another may take it.
const LEASE: Duration = Duration::from_secs(60);
/// At most this many records per background sweep, so one sweep cannot run forever
/// (`verify --repair`, which an operator runs to finish everything, takes them all).
const MAX_PER_SWEEP: usize = 1000;

/// What a repair pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RepairReport {
    /// `issuing` records finished (their set completed, settled, marked `issued`).
    pub records_finished: u64,
    /// Tokens written to complete them.
    pub tokens_created: u64,
    /// Short `issued` sets re-opened for completion (`verify --repair` only).
    pub records_reopened: u64,
    /// Active tokens revoked because their payment no longer stands for them.
    pub tokens_revoked: u64,
    /// Records that could not be finished (logged; retried by the next sweep).
    pub failed: u64,
}

impl Issuer {
    /// Finishes the `issuing` records created more than `min_age` ago, at most
    /// [`MAX_PER_SWEEP`] of them.
    pub async fn repair_unfinished(&self, min_age: Duration) -> Result<RepairReport, StoreError> {
        self.finish_unfinished(min_age, MAX_PER_SWEEP).await
    }

    /// Finishes the `issuing` records created more than `min_age` ago, at most `limit`.
    /// A record tried and left `issuing` (refused, unreadable, failed, or its batch's)
    /// is passed over for the rest of the call, so none is tried twice in one call and
    /// the call ends; the next sweep tries it again, once its lease is over.
    async fn finish_unfinished(
        &self,
        min_age: Duration,
        limit: usize,
    ) -> Result<RepairReport, StoreError> {
        let mut report = RepairReport::default();
        let created_before =
            DateTime::from_millis(DateTime::now().timestamp_millis() - min_age.as_millis() as i64);
        // Records tried and left `issuing`: leasable again (at once, or when the lease
        // runs out), they would come first again and again, the oldest, and a call that
        // lasts longer than a lease would never end.
        let mut passed = Vec::new();
        for _ in 0..limit {
            let Some(attempt) = self
                .store
                .lease_unfinished_record(created_before, LEASE, &passed)
                .await?
            else {
                break;
            };
            let record = match attempt {
                LeaseAttempt::Leased(record) => record,
                LeaseAttempt::Unreadable { id, error } => {
                    report.failed += 1;
                    failed(
                        &format!("record {id}"),
                        "cannot read an unfinished issuance",
                        &error,
                    );
                    passed.push(id);
                    continue;
                }
                LeaseAttempt::Refused { id, error } => {
                    report.failed += 1;
                    failed(
                        &format!("record {id}"),
                        "cannot lease an unfinished issuance",
                        &error,
                    );
                    passed.push(id);
                    continue;
                }
            };
            // A batch's record its batch has not decided yet: left to a batch that is only
            // slow as a request leaves it (`verify --repair` looks at records of any age,
            // and confirming one the batch's read is about to refuse would write tokens
            // for a refused request), confirmed once its batch stalled or died, and
            // skipped when the batch took it back meanwhile.
            let id = Bson::ObjectId(record.id);
            let Some(record) = self.once_confirmed(record).await? else {
                passed.push(id);
                continue;
            };
            let payment = format!(
                "{}/{}/{}",
                record.provider, record.account_id, record.payment_intent_id
            );
            match self.complete(record).await {
                Ok(issued) => {
                    report.records_finished += 1;
                    report.tokens_created += u64::from(issued.created);
                    metrics::counter!(metric::REPAIRS_TOTAL, "outcome" => "completed").increment(1);
                    tracing::info!(%payment, tokens_created = issued.created, "repaired an unfinished issuance");
                }
                // Finished, and the payment was refunded or canceled meanwhile: the
                // settle revoked its tokens, which is the repair.
                Err(IssueError::PaymentNotSucceeded(status)) => {
                    report.records_finished += 1;
                    metrics::counter!(metric::REPAIRS_TOTAL, "outcome" => "revoked").increment(1);
                    tracing::info!(%payment, status = status.as_str(), "repaired an unfinished issuance of a withdrawn payment");
                }
                Err(IssueError::Store(err @ StoreError::Unavailable(_))) => return Err(err),
                Err(err) => {
                    report.failed += 1;
                    passed.push(id);
                    metrics::counter!(metric::REPAIRS_TOTAL, "outcome" => "failed").increment(1);
                    tracing::error!(%payment, error = %err, "cannot repair an unfinished issuance");
                }
            }
        }
        Ok(report)
    }

    /// Everything `verify --repair` fixes: short sets completed (also `issued` ones),
    /// and the tokens of refunded or canceled payments settled.
    pub async fn repair_all(&self) -> Result<RepairReport, StoreError> {
        let reopened = self.store.reopen_short_sets().await?;
        // Every record that was there when it began: records created since are not
        // looked at, and each is leased when tried, so this ends.
        let mut report = self.finish_unfinished(Duration::ZERO, usize::MAX).await?;
        report.records_reopened = reopened;
        for listed in self.store.payments_taking_back().await? {
            match self.settle_listed(listed).await? {
                Some((_, settlement)) => report.tokens_revoked += settlement.revoked,
                None => report.failed += 1,
            }
        }
        Ok(report)
    }
}

impl Issuer {
    /// Settles the payments refunded, canceled or partly refunded in the last `lookback`.
    /// A refund whose process died between recording the payment's state and settling is
    /// redelivered by its provider, but maybe only much later: this settles it meanwhile.
    /// (An issuance's own settle cannot be lost this way: its record stays `issuing` until
    /// the settle is done, for `repair_unfinished`.) Settling is idempotent, so sweeping
    /// recent withdrawals again costs one query and, per payment, a write that changes
    /// nothing.
    pub async fn repair_recent_withdrawals(&self, lookback: Duration) -> Result<u64, StoreError> {
        let since =
            DateTime::from_millis(DateTime::now().timestamp_millis() - lookback.as_millis() as i64);
        let mut revoked = 0;
        for listed in self.store.payments_taking_back_since(since).await? {
            let Some((key, settlement)) = self.settle_listed(listed).await? else {
                continue;
            };
            if settlement.revoked > 0 {
                metrics::counter!(metric::REPAIRS_TOTAL, "outcome" => "revoked").increment(1);
                tracing::info!(payment = %key.payment_intent_id, revoked = settlement.revoked, "revoked tokens a crashed issuance left active after a refund");
            }
            revoked += settlement.revoked;
        }
        Ok(revoked)
    }
}

impl Issuer {
    /// Settles a payment a sweep listed, by the payment as it is now: the listing may be
    /// minutes old, and a payment that stands again since (money came back, or it
    /// succeeded again) must not lose its tokens to it, even for a moment — the settle
    /// would bring them back only by a later read, which may never come if the sweep
    /// stops there, and nothing would list the payment again.
    ///
    /// The payment's key and what its settle did; `None` when this payment alone could
    /// not be settled (its key, record or payment cannot be read, or the settle failed
    /// for a reason of its own): logged, for the sweep to go on to the next; only an
    /// outage stops the sweep.
    async fn settle_listed(
        &self,
        listed: Result<PaymentKey, StoreError>,
    ) -> Result<Option<(PaymentKey, Settlement)>, StoreError> {
        let key = match listed {
            Ok(key) => key,
            Err(err) => {
                failed("", "cannot read a refunded or canceled payment's key", &err);
                return Ok(None);
            }
        };
        let settled = async {
            let record = self.store.find_record(&key).await?;
            let payment = self.store.find_payment(&key).await?;
            self.settle_recorded(&key, record.as_ref(), payment.as_ref())
                .await
        };
        match settled.await {
            Ok(settlement) => Ok(Some((key, settlement))),
            Err(err @ StoreError::Unavailable(_)) => Err(err),
            Err(err) => {
                let payment = format!(
                    "{}/{}/{}",
                    key.provider.as_str(),
                    key.account_id.as_str(),
                    key.payment_intent_id.as_str()
                );
                failed(
                    &payment,
                    "cannot settle a refunded or canceled payment",
                    &err,
                );
                Ok(None)
            }
        }
    }
}

/// Logs and counts a repair that failed for one record or payment alone (`payment`, its
/// key, or the record's `_id` when the key is not read yet; empty when unknown).
fn failed(payment: &str, what: &'static str, err: &StoreError) {
    metrics::counter!(metric::REPAIRS_TOTAL, "outcome" => "failed").increment(1);
    tracing::error!(%payment, error = %err, "{what}");
}

/// Every `interval`, for as long as the process lives: `repair_unfinished(min_age)`,
/// then `repair_recent_withdrawals(lookback)`, each whatever the other did. The sweep of
/// withdrawals is what settles a refund whose own settle was lost: an unfinished record
/// the database keeps failing (one it will not lease, say) must not starve it.
pub fn spawn_repair(issuer: Issuer, interval: Duration, min_age: Duration, lookback: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            // Either failing means the database is down or electing, or one record or
            // payment failed it: the next tick tries again.
            if let Err(err) = issuer.repair_unfinished(min_age).await {
                tracing::warn!(error = %err, "self-repair of unfinished issuances interrupted");
            }
            if let Err(err) = issuer.repair_recent_withdrawals(lookback).await {
                tracing::warn!(error = %err, "self-repair sweep of withdrawals interrupted");
            }
        }
    });
}
