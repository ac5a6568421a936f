//! The retry policy of the `_version` gate: exponential backoff with jitter,
//! bounded both by attempts and by a total time budget. Deterministic under a seeded
//! generator, so its schedule is unit-tested rather than timed.

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
        if elapsed + delay > self.policy.budget {
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
