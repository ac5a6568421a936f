//! Every bounded retry of the service, in one type with its bounds side by side.
//!
//! `RetryPolicy` bounds an operation by attempts and, when it pauses between them, by
//! a total time budget: the `_version` gate's (configured, `store.version_gate`) backs
//! off exponentially with jitter, deterministic under a seeded generator, so its
//! schedule is unit-tested rather than timed. The fixed bounds below retry at once
//! (each follows a change someone else made, which waiting would not undo), except a
//! transaction's, whose pause lets the conflicting transaction commit.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Parameters: `base` doubles per retry, plus 0..=`max_jitter`; at most `max_attempts`
/// attempts in all, and no retry that would end past `budget`.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max_jitter: Duration,
    pub max_attempts: u32,
    pub budget: Duration,
}

impl RetryPolicy {
    /// `max_attempts` tries in all, bounded by count alone: no backoff schedule of its
    /// own (`Backoff`), so the tries follow one another at once unless the caller pauses.
    pub const fn attempts(max_attempts: u32) -> Self {
        Self {
            base: Duration::ZERO,
            max_jitter: Duration::ZERO,
            max_attempts,
            budget: Duration::MAX,
        }
    }

    /// Whether another try may follow `made` tries.
    pub const fn allows_another(self, made: u32) -> bool {
        made < self.max_attempts
    }
}

/// A claim or take-over of a payment's place whose record keeps changing under it (taken
/// over, expired, re-created): three looks, then the request fails and its client retries.
pub const RECORD_CHANGE: RetryPolicy = RetryPolicy::attempts(3);

/// A status the money decides, after another event changed the payment meanwhile: three
/// tries, then the delivery fails and its redelivery decides again.
pub const PAYMENT_STATUS: RetryPolicy = RetryPolicy::attempts(3);

/// An `Idempotency-Key` whose colliding record vanished before it could be read (expired,
/// or released by an attempt that failed with a 5xx): three looks.
pub const IDEMPOTENCY_CLAIM: RetryPolicy = RetryPolicy::attempts(3);

/// Transactions per atomic group-commit batch: one that the payments' state refuses, or
/// that runs into an existing record (then a read finds which), is followed by one
/// without those requests, so the third normally commits; the fourth is the margin.
pub const ATOMIC_BATCH: RetryPolicy = RetryPolicy::attempts(4);

/// The first-insert race of two upserts of a new key (the loser's duplicate key): the
/// first try and three more, each of which finds the winner's document.
pub const FIRST_INSERT: RetryPolicy = RetryPolicy::attempts(4);

/// A transaction that ends in a transient error (a write conflict with a concurrent
/// one): ten tries, the n-th after (n × `TRANSACTION_PAUSE_STEP`), about a quarter of a
/// second in all; still conflicting then, another transaction holds the keys.
pub const TRANSACTION: RetryPolicy = RetryPolicy::attempts(10);

/// The growth of the pause between a transaction's tries: short, since the conflicting
/// transaction is usually one round trip from its commit.
pub const TRANSACTION_PAUSE_STEP: Duration = Duration::from_millis(5);

/// A commit whose outcome is unknown (a lost reply, a step-down): the commit is
/// idempotent, so it is sent again, four tries in all.
pub const UNKNOWN_COMMIT: RetryPolicy = RetryPolicy::attempts(4);

/// The pause before a transaction's `attempt`-th try (the second and on).
pub fn transaction_pause(attempt: u32) -> Duration {
    TRANSACTION_PAUSE_STEP * attempt
}

/// One operation's schedule of retries.
pub struct Backoff {
    policy: RetryPolicy,
    rng: StdRng,
    attempts: u32,
}

impl Backoff {
    /// A schedule with fresh randomness (production).
    pub fn new(policy: RetryPolicy) -> Self {
        Self::seeded(policy, rand::random())
    }

    /// A reproducible schedule (tests).
    pub fn seeded(policy: RetryPolicy, seed: u64) -> Self {
        Self {
            policy,
            rng: StdRng::seed_from_u64(seed),
            attempts: 1,
        }
    }

    /// The pause before the next attempt, given the time spent so far; `None` when the
    /// attempts or the budget are used up.
    pub fn next_delay(&mut self, elapsed: Duration) -> Option<Duration> {
        if self.attempts >= self.policy.max_attempts {
            return None;
        }
        let exponent = (self.attempts - 1).min(20);
        let jitter_ms = self
            .rng
            .random_range(0..=self.policy.max_jitter.as_millis() as u64);
        let delay = self.policy.base * 2u32.pow(exponent) + Duration::from_millis(jitter_ms);
        if elapsed.saturating_add(delay) > self.policy.budget {
            return None;
        }
        self.attempts += 1;
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_millis(10),
            max_jitter: Duration::from_millis(50),
            max_attempts: 5,
            budget: Duration::from_secs(5),
        }
    }

    #[test]
    fn delays_double_within_their_jitter_and_stop_after_max_attempts() {
        let mut backoff = Backoff::seeded(policy(), 7);
        let mut delays = Vec::new();
        while let Some(delay) = backoff.next_delay(Duration::ZERO) {
            delays.push(delay);
        }
        assert_eq!(delays.len(), 4, "5 attempts = first try + 4 retries");
        for (i, delay) in delays.iter().enumerate() {
            let floor = Duration::from_millis(10 * 2u64.pow(i as u32));
            assert!(
                *delay >= floor && *delay <= floor + Duration::from_millis(50),
                "{i}: {delay:?}"
            );
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        let run = |seed| {
            let mut backoff = Backoff::seeded(policy(), seed);
            std::iter::from_fn(|| backoff.next_delay(Duration::ZERO)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43), "jitter depends on the seed");
    }

    #[test]
    fn budget_stops_retries() {
        let mut backoff = Backoff::seeded(policy(), 1);
        assert!(backoff.next_delay(Duration::from_millis(4_990)).is_none());
        let mut backoff = Backoff::seeded(policy(), 1);
        assert!(backoff.next_delay(Duration::from_millis(100)).is_some());
    }
}
