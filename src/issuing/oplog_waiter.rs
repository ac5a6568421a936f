//! A cursor kept waiting on the oplog while this instance is quiet, on a replica set of
//! one member (the embedded default): it takes a millisecond tick off each majority
//! write.
//!
//! mongod acknowledges a majority write once the write is visible in its oplog. It makes
//! new entries visible at once when a cursor waits on the oplog, and otherwise only on a
//! timer of about a millisecond. On a set with secondaries their oplog readers always
//! wait, so nothing is to be gained there; on a set of one member nobody waits, and every
//! issuance (its mark), redemption (its commit) and token action pays the tick: at one
//! request at a time, a quarter of the request's time (docs/BENCHMARKS.md).
//!
//! So while the instance writes fewer documents a second than the bound
//! (`mongo.oplog_waiter_below_per_second`), it holds a change stream that reports nothing
//! (`Store::wait_on_oplog`). The stream costs mongod a read of every oplog entry, one per
//! document written, which under load costs more than the tick saves: at 32 issuances of
//! 4 tokens at a time (about 12,000 documents a second) 3.5 and 6.4 % of the issuance
//! rate in two runs, at 16 issuances of 100 tokens (about 30,000) 11 and 14 %. So the
//! load is counted in documents, not requests. At the bound the stream is closed, and it
//! is opened again only below half of it, so that a load hovering at the bound does not
//! open and close it every second. The load is sampled once a second; nothing here is on
//! a request's path. Each instance counts its own load: several instances on one member
//! each hold a stream, and together may pass the bound unseen.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::Issuer;
use crate::store::StoreError;

/// How often the load is sampled.
const SAMPLE: Duration = Duration::from_secs(1);
/// How long after a failed open (or a stream that ended) the waiter tries again.
const REOPEN_DELAY: Duration = Duration::from_secs(1);

/// The documents this instance's requests may write, counted since it started as each
/// request arrives (an issuance its record and tokens, a redemption its record and the
/// tokens it spends, a token action one, a provider event its record and the payment's):
/// their count over a second is the load the waiter is held or closed by.
#[derive(Debug, Default)]
pub(super) struct Writes(AtomicU64);

impl Writes {
    /// Counts a request that may write `documents`.
    pub(super) fn count(&self, documents: u64) {
        self.0.fetch_add(documents, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Issuer {
    /// Starts holding the oplog waiter while the load stays below `below` documents a
    /// second; it runs until the returned handle is dropped. It first opens at once: an
    /// idle instance starts quiet. Whether the deployment is one that gains from it (a
    /// replica set of one member) is the caller's to ask.
    pub fn hold_oplog_waiter(&self, below: NonZeroU32) -> OplogWaiter {
        let store = self.store.clone();
        let mut load = Load::new(self.writes.clone(), below);
        let task = tokio::spawn(async move {
            // A failure is told once, until the waiter is open again: a deployment whose
            // user may not open change streams would otherwise log it every second.
            let mut failing = Failing::default();
            loop {
                load.until_quiet().await;
                match store.wait_on_oplog().await {
                    Ok(waiting) => {
                        failing = Failing::default();
                        tokio::select! {
                            ended = waiting => {
                                if let Err(err) = ended {
                                    failing.tell(&err, "the oplog waiter's stream ended");
                                }
                                tokio::time::sleep(REOPEN_DELAY).await;
                            }
                            () = load.until_busy() => {}
                        }
                    }
                    Err(err) => {
                        failing.tell(&err, "cannot open the oplog waiter's change stream");
                        tokio::time::sleep(REOPEN_DELAY).await;
                    }
                }
            }
        });
        OplogWaiter { task }
    }
}

/// Whether the waiter's failures since it was last open were told.
#[derive(Default)]
struct Failing {
    told: bool,
}

impl Failing {
    /// Logs `err` as a warning the first time, then at debug level.
    fn tell(&mut self, err: &StoreError, what: &str) {
        if std::mem::replace(&mut self.told, true) {
            tracing::debug!(error = %err, "{what}; retrying");
        } else {
            tracing::warn!(error = %err, "{what}; retrying every second, the majority's confirmations wait for mongod's tick meanwhile");
        }
    }
}

/// The load, sampled every `SAMPLE`, in documents a second.
struct Load {
    writes: Arc<Writes>,
    below: u64,
    ticks: Interval,
    /// The total and the moment of the last sample.
    last: (u64, Instant),
}

impl Load {
    fn new(writes: Arc<Writes>, below: NonZeroU32) -> Self {
        let mut ticks = tokio::time::interval(SAMPLE);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            last: (writes.total(), Instant::now()),
            writes,
            below: u64::from(below.get()),
            ticks,
        }
    }

    /// The documents a second since the last sample, at the next tick (the first tick is at
    /// once). A tick may come late, after a pause: the rate is over the time that passed.
    /// Cancel-safe: a sample is taken only when its tick has come.
    async fn next_rate(&mut self) -> u64 {
        self.ticks.tick().await;
        let (total, now) = (self.writes.total(), Instant::now());
        let (last_total, last_at) = std::mem::replace(&mut self.last, (total, now));
        let millis = now.duration_since(last_at).as_millis().max(1);
        u64::try_from(u128::from(total - last_total) * 1000 / millis).unwrap_or(u64::MAX)
    }

    /// Returns at the first sample below half the bound.
    async fn until_quiet(&mut self) {
        while self.next_rate().await >= self.below.div_ceil(2) {}
    }

    /// Returns at the first sample at the bound or above.
    async fn until_busy(&mut self) {
        while self.next_rate().await < self.below {}
    }
}

/// The running task of `Issuer::hold_oplog_waiter`; dropping it closes the stream.
pub struct OplogWaiter {
    task: JoinHandle<()>,
}

impl Drop for OplogWaiter {
    fn drop(&mut self) {
        self.task.abort();
    }
}
