//! Rate limits. `[rate_limit]`: a GCRA bucket per API key id, and one per webhook
//! provider, taken only by deliveries whose signature holds (so nobody but the provider
//! can spend its allowance). Failed signature checks have buckets of their own, per remote
//! address. Key and provider buckets are keyed by configured ids and names only — never
//! values a client can invent — so their memory is bounded; the address buckets are
//! pruned (see [`RateLimits::check_failed_signature`]).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::error::ApiError;
use crate::settings::RateLimitSettings;
use crate::telemetry::metric;

/// Failed signature checks one remote address may make in a row...
const FAILED_SIGNATURE_BURST: u32 = 20;
/// ...and then per second. A provider whose deliveries fail (a secret rotated on one
/// side only) retries on 429 as on 401; anything faster is someone guessing.
const FAILED_SIGNATURES_PER_SECOND: u32 = 2;
/// Above this many remembered addresses, buckets back at full allowance are dropped...
const PRUNE_ABOVE: usize = 10_000;
/// ...at most once per this many nanoseconds, so pruning never runs per request.
const PRUNE_EVERY_NANOS: u64 = 1_000_000_000;

pub struct RateLimits {
    limiter: DefaultKeyedRateLimiter<String>,
    failed_signatures: DefaultKeyedRateLimiter<IpAddr>,
    /// When `failed_signatures` was last pruned, in nanoseconds after `started`.
    last_prune: AtomicU64,
    started: Instant,
    clock: DefaultClock,
}

impl RateLimits {
    pub fn new(settings: &RateLimitSettings) -> Self {
        // Settings validation guarantees both are > 0.
        let rate = NonZeroU32::new(settings.per_key_per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.burst).unwrap_or(rate);
        let failures = Quota::per_second(
            NonZeroU32::new(FAILED_SIGNATURES_PER_SECOND).unwrap_or(NonZeroU32::MIN),
        )
        .allow_burst(NonZeroU32::new(FAILED_SIGNATURE_BURST).unwrap_or(NonZeroU32::MIN));
        let clock = DefaultClock::default();
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            failed_signatures: RateLimiter::keyed(failures),
            last_prune: AtomicU64::new(0),
            started: Instant::now(),
            clock,
        }
    }

    /// Takes one request from `bucket`'s allowance, or answers 429 with the wait.
    pub fn check(&self, bucket: String) -> Result<(), ApiError> {
        let checked = self.limiter.check_key(&bucket);
        checked.map_err(|not_until| self.limited(not_until))
    }

    /// Takes one failed signature check from `remote`'s allowance, or answers 429 with
    /// the wait. IPv6 addresses count per /64 (what one host usually holds), so one host
    /// cannot get a fresh allowance per address.
    pub fn check_failed_signature(&self, remote: IpAddr) -> Result<(), ApiError> {
        self.prune();
        let checked = self.failed_signatures.check_key(&address_bucket(remote));
        checked.map_err(|not_until| self.limited(not_until))
    }

    /// Forgets addresses whose bucket is full again (as if never seen) once there are
    /// many, so addresses that fail once each cannot grow the map without bound.
    fn prune(&self) {
        if self.failed_signatures.len() <= PRUNE_ABOVE {
            return;
        }
        let now = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let last = self.last_prune.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= PRUNE_EVERY_NANOS
            && self
                .last_prune
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.failed_signatures.retain_recent();
            self.failed_signatures.shrink_to_fit();
        }
    }

    fn limited(&self, not_until: governor::NotUntil<<DefaultClock as Clock>::Instant>) -> ApiError {
        let wait = not_until.wait_time_from(self.clock.now());
        metrics::counter!(metric::RATE_LIMITED_TOTAL).increment(1);
        ApiError::RateLimited {
            retry_after_secs: retry_after_secs(wait),
        }
    }
}

/// `Retry-After` is whole seconds (RFC 9110 §10.2.3): the wait rounded up, and at least 1,
/// so a client that waits what it is told is never refused again for waiting too little.
fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    let rounded_up = if wait.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    rounded_up.max(1)
}

/// The bucket of a remote address: itself for IPv4 (also when IPv4-mapped), its /64 for
/// IPv6.
fn address_bucket(remote: IpAddr) -> IpAddr {
    match remote {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RateLimitSettings {
        RateLimitSettings {
            per_key_per_second: 1,
            burst: 1,
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        for (wait_ms, secs) in [
            (0, 1),
            (1, 1),
            (300, 1),
            (999, 1),
            (1000, 1),
            (1001, 2),
            (1300, 2),
            (2000, 2),
            (59_999, 60),
        ] {
            assert_eq!(
                retry_after_secs(Duration::from_millis(wait_ms)),
                secs,
                "{wait_ms} ms"
            );
        }
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn a_429_says_a_whole_number_of_seconds() {
        let limits = RateLimits::new(&RateLimitSettings {
            per_key_per_second: 3,
            burst: 1,
        });
        assert!(limits.check("k".to_owned()).is_ok());
        // The next request is allowed ~333 ms later: the answer says 1, not 0.
        match limits.check("k".to_owned()) {
            Err(ApiError::RateLimited { retry_after_secs }) => assert_eq!(retry_after_secs, 1),
            other => panic!("expected 429, got {other:?}"),
        }
    }

    #[test]
    fn failed_signatures_are_limited_per_address_apart_from_the_provider() {
        let limits = RateLimits::new(&settings());
        let attacker: IpAddr = "203.0.113.7".parse().unwrap();
        for _ in 0..FAILED_SIGNATURE_BURST {
            assert!(limits.check_failed_signature(attacker).is_ok());
        }
        assert!(matches!(
            limits.check_failed_signature(attacker),
            Err(ApiError::RateLimited { .. })
        ));
        // Another address, and the provider's own bucket, are untouched.
        assert!(
            limits
                .check_failed_signature("203.0.113.8".parse().unwrap())
                .is_ok()
        );
        assert!(limits.check("webhook:stripe".to_owned()).is_ok());
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_bucket(a), address_bucket(b));
        assert_ne!(address_bucket(a), address_bucket(other));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(
            address_bucket(mapped),
            "192.0.2.1".parse::<IpAddr>().unwrap()
        );
    }
}
