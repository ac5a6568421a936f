//! Rate limits. `[rate_limit]`: a GCRA bucket per API key id, and one per webhook
//! provider, taken only by deliveries whose signature holds (so nobody but the provider
//! can spend its allowance). A checkout key — one holding only `issuances:request` — is
//! public by design, so its requests are limited per client address instead
//! (`per_address_*`): one abuser exhausts its own address's allowance, never the key's.
//! Failed signature checks have buckets of their own, per client address too.
//!
//! Memory: key and provider buckets are keyed by configured ids and names only — never
//! values a client can invent. Address buckets are keyed by what a client can vary, so
//! they are bounded twice: buckets back at full allowance (indistinguishable from new)
//! are dropped once there are more than `PRUNE_ABOVE`, at most once a second; and at
//! most `MAX_ADDRESSES` are kept at all — an address seen while the table is full shares
//! one overflow bucket (`Bucket::Overflow`) until pruning makes room. An abuser rotating
//! addresses faster than buckets refill so degrades new addresses to one shared
//! allowance; it cannot grow memory past `MAX_ADDRESSES` buckets (a few MiB).
//!
//! Every decision is told as `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers): on a 429 with `Retry-After`, and on an admitted
//! request through `note_limits`.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::{StateInformationMiddleware, StateSnapshot};
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::state::keyed::{
    DashMapStateStore, DefaultKeyedStateStore, ShrinkableKeyedStateStore,
};
use governor::{NotUntil, Quota, RateLimiter};

use crate::domain::ClientAddress;
use crate::settings::RateLimitSettings;
use crate::telemetry::metric;

/// Failed signature checks one client address may make in a row...
const FAILED_SIGNATURE_BURST: u32 = 20;
/// ...and then per second. A provider whose deliveries fail (a secret rotated on one
/// side only) retries on 429 as on 401; anything faster is someone guessing.
const FAILED_SIGNATURES_PER_SECOND: u32 = 2;
/// Above this many remembered addresses, buckets back at full allowance are dropped...
const PRUNE_ABOVE: usize = 10_000;
/// ...at most once per this many nanoseconds, so pruning never runs per request.
const PRUNE_EVERY_NANOS: u64 = 1_000_000_000;
/// The most address buckets one limiter keeps (each some tens of bytes).
const MAX_ADDRESSES: usize = 100_000;

pub const RATE_LIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATE_LIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which limit decided: the `limiter` label of `tokenmint_rate_limited_total` (one of
/// `metric::RATE_LIMITERS`) and the policy's name in the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limiter {
    /// A trusted key's own bucket.
    Key,
    /// A checkout key's client address.
    Address,
    /// A webhook provider's verified deliveries.
    Provider,
    /// Failed webhook signature or credential checks of a client address.
    Signature,
}

impl Limiter {
    pub fn label(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Address => "address",
            Self::Provider => "provider",
            Self::Signature => "signature",
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitHeaders {
    /// `"<limiter>";q=<burst>;w=<seconds to refill the whole burst>`.
    pub policy: String,
    /// `"<limiter>";r=<requests left now>;t=<seconds until all are back>`.
    pub current: String,
}

impl LimitHeaders {
    fn new(limiter: Limiter, quota: Quota, remaining: u32, until_full: Duration) -> Self {
        let name = limiter.label();
        let burst = quota.burst_size().get();
        let window = whole_seconds(quota.burst_size_replenished_in());
        let until_full = whole_seconds(until_full);
        Self {
            policy: format!("\"{name}\";q={burst};w={window}"),
            current: format!("\"{name}\";r={remaining};t={until_full}"),
        }
    }

    /// Sets both fields on `headers`.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        for (name, value) in [
            (RATE_LIMIT_POLICY, &self.policy),
            (RATE_LIMIT, &self.current),
        ] {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        }
    }
}

/// A request a limit refused: when one request is back, and the limit that refused
/// (the HTTP layer answers it 429 with `Retry-After`). A type of its own, so that the
/// limits know nothing of the error envelope that tells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub retry_after_secs: u64,
    pub limit: LimitHeaders,
}

/// A bucket of an address limiter: a client address, or the one shared by addresses
/// seen while the table is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bucket {
    Address(ClientAddress),
    Overflow,
}

/// governor's concurrent map, with at most `cap` buckets: a new address beyond it is
/// measured in `Bucket::Overflow`. Checking and inserting are not one step, so under
/// concurrency the map may pass `cap` by the requests in flight — still bounded.
struct CappedStore {
    map: DashMapStateStore<Bucket>,
    cap: usize,
}

impl StateStore for CappedStore {
    type Key = Bucket;

    fn measure_and_replace<T, F, E>(&self, key: &Bucket, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let key = if self.map.contains_key(key) || self.map.len() < self.cap {
            key
        } else {
            &Bucket::Overflow
        };
        self.map.measure_and_replace(key, f)
    }
}

impl ShrinkableKeyedStateStore<Bucket> for CappedStore {
    fn retain_recent(&self, drop_below: Nanos) {
        self.map.retain_recent(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Buckets per client address, bounded (see the module's documentation).
struct AddressLimiter {
    limiter: RateLimiter<Bucket, CappedStore, DefaultClock, StateInformationMiddleware>,
    limiter_kind: Limiter,
    /// When the buckets were last pruned, in nanoseconds after `started`.
    last_prune: AtomicU64,
    started: Instant,
}

impl AddressLimiter {
    fn new(quota: Quota, limiter_kind: Limiter, cap: usize) -> Self {
        let store = CappedStore {
            map: DashMapStateStore::default(),
            cap,
        };
        Self {
            limiter: RateLimiter::new(quota, store, DefaultClock::default()),
            limiter_kind,
            last_prune: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    fn check(&self, client: ClientAddress) -> Result<LimitHeaders, Refused> {
        self.prune();
        let decided = self.limiter.check_key(&Bucket::Address(client));
        decide(self.limiter_kind, self.limiter.clock(), decided)
    }

    /// Forgets addresses whose bucket is full again (as if never seen) once there are
    /// many, so addresses that come once each free their place.
    fn prune(&self) {
        if self.limiter.len() <= PRUNE_ABOVE {
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
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
    }
}

type NamedLimiter =
    RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock, StateInformationMiddleware>;

pub struct RateLimits {
    keys: NamedLimiter,
    providers: NamedLimiter,
    addresses: AddressLimiter,
    failed_signatures: AddressLimiter,
}

impl RateLimits {
    pub fn new(settings: &RateLimitSettings) -> Self {
        // Settings validation guarantees both are > 0.
        let rate = NonZeroU32::new(settings.per_key_per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.burst).unwrap_or(rate);
        let named = Quota::per_second(rate).allow_burst(burst);
        let per_address = Quota::per_second(settings.per_address_per_second)
            .allow_burst(settings.per_address_burst);
        let failures = Quota::per_second(
            NonZeroU32::new(FAILED_SIGNATURES_PER_SECOND).unwrap_or(NonZeroU32::MIN),
        )
        .allow_burst(NonZeroU32::new(FAILED_SIGNATURE_BURST).unwrap_or(NonZeroU32::MIN));
        Self {
            keys: RateLimiter::keyed(named).with_middleware::<StateInformationMiddleware>(),
            providers: RateLimiter::keyed(named).with_middleware::<StateInformationMiddleware>(),
            addresses: AddressLimiter::new(per_address, Limiter::Address, MAX_ADDRESSES),
            failed_signatures: AddressLimiter::new(failures, Limiter::Signature, MAX_ADDRESSES),
        }
    }

    /// Takes one request from the configured key `key_id`'s allowance, or answers 429.
    pub fn check_key(&self, key_id: &str) -> Result<LimitHeaders, Refused> {
        let decided = self.keys.check_key(&key_id.to_owned());
        decide(Limiter::Key, self.keys.clock(), decided)
    }

    /// Takes one verified delivery from the configured `provider`'s allowance.
    pub fn check_provider(&self, provider: &str) -> Result<LimitHeaders, Refused> {
        let decided = self.providers.check_key(&provider.to_owned());
        decide(Limiter::Provider, self.providers.clock(), decided)
    }

    /// Takes one checkout-key request from `client`'s allowance.
    pub fn check_address(&self, client: ClientAddress) -> Result<LimitHeaders, Refused> {
        self.addresses.check(client)
    }

    /// Takes one failed signature (or credential) check from `client`'s allowance.
    pub fn check_failed_signature(&self, client: ClientAddress) -> Result<(), Refused> {
        self.failed_signatures.check(client).map(drop)
    }
}

/// The headers of an admitted request, or the 429 of a refused one (counted by limiter).
fn decide(
    limiter: Limiter,
    clock: &DefaultClock,
    decided: Result<StateSnapshot, NotUntil<<DefaultClock as Clock>::Instant>>,
) -> Result<LimitHeaders, Refused> {
    match decided {
        Ok(snapshot) => {
            let quota = snapshot.quota();
            let remaining = snapshot.remaining_burst_capacity();
            // Each request taken comes back one replenish interval after the last: an
            // upper bound, since the oldest may be partly back already.
            let taken = quota.burst_size().get().saturating_sub(remaining);
            let until_full = quota.replenish_interval().saturating_mul(taken);
            Ok(LimitHeaders::new(limiter, quota, remaining, until_full))
        }
        Err(not_until) => {
            let quota = not_until.quota();
            let wait = not_until.wait_time_from(clock.now());
            // One request is back after `wait`, the rest one interval after another.
            let rest = quota.burst_size().get() - 1;
            let until_full = wait.saturating_add(quota.replenish_interval().saturating_mul(rest));
            metrics::counter!(metric::RATE_LIMITED_TOTAL, "limiter" => limiter.label())
                .increment(1);
            Err(Refused {
                retry_after_secs: whole_seconds(wait),
                limit: LimitHeaders::new(limiter, quota, 0, until_full),
            })
        }
    }
}

/// `Retry-After` (RFC 9110 §10.2.3) and the headers' seconds are whole seconds: the wait
/// rounded up, and at least 1, so a client that waits what it is told is never refused
/// again for waiting too little.
fn whole_seconds(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    let rounded_up = if wait.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    rounded_up.max(1)
}

/// Where an extractor leaves the limit that admitted the request, for `note_limits`.
#[derive(Clone, Default)]
pub struct AdmittedBy(Arc<OnceLock<LimitHeaders>>);

impl AdmittedBy {
    /// Records the decision that let the request through (the first one counts).
    pub fn record(&self, headers: LimitHeaders) {
        let _ = self.0.set(headers);
    }
}

/// Puts `RateLimit-Policy` and `RateLimit` on the answer of a request a rate limit
/// admitted (a refused one carries them in its 429 already).
pub async fn note_limits(mut req: Request, next: Next) -> Response {
    let admitted = AdmittedBy::default();
    req.extensions_mut().insert(admitted.clone());
    let mut response = next.run(req).await;
    if let Some(limit) = admitted.0.get()
        && !response.headers().contains_key(RATE_LIMIT)
    {
        limit.insert_into(response.headers_mut());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(per_key_per_second: u32, burst: u32) -> RateLimitSettings {
        RateLimitSettings {
            per_key_per_second,
            burst,
            per_address_per_second: NonZeroU32::MIN,
            per_address_burst: NonZeroU32::new(2).unwrap(),
        }
    }

    fn address(text: &str) -> ClientAddress {
        ClientAddress::of(text.parse().unwrap())
    }

    fn refused(result: Result<LimitHeaders, Refused>) -> (u64, LimitHeaders) {
        match result {
            Err(Refused {
                retry_after_secs,
                limit,
            }) => (retry_after_secs, limit),
            other => panic!("expected 429, got {other:?}"),
        }
    }

    #[test]
    fn the_labels_are_the_registered_ones() {
        let labels = [
            Limiter::Key,
            Limiter::Address,
            Limiter::Provider,
            Limiter::Signature,
        ]
        .map(Limiter::label);
        assert_eq!(labels, metric::RATE_LIMITERS);
    }

    #[test]
    fn whole_seconds_round_up() {
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
                whole_seconds(Duration::from_millis(wait_ms)),
                secs,
                "{wait_ms} ms"
            );
        }
        assert_eq!(whole_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds(Duration::MAX), u64::MAX);
    }

    #[test]
    fn a_429_says_a_whole_number_of_seconds_and_its_policy() {
        let limits = RateLimits::new(&settings(3, 1));
        let admitted = limits.check_key("k").unwrap();
        assert_eq!(admitted.policy, "\"key\";q=1;w=1");
        assert_eq!(admitted.current, "\"key\";r=0;t=1");
        // The next request is allowed ~333 ms later: the answer says 1, not 0.
        let (retry_after, limit) = refused(limits.check_key("k"));
        assert_eq!(retry_after, 1);
        assert_eq!(limit.policy, "\"key\";q=1;w=1");
        assert_eq!(limit.current, "\"key\";r=0;t=1");
    }

    #[test]
    fn the_headers_count_down_what_is_left() {
        let limits = RateLimits::new(&settings(1, 3));
        let left: Vec<String> = (0..3)
            .map(|_| limits.check_key("k").unwrap().current)
            .collect();
        // At 1 per second the burst of 3 is back 3 s after it was used (upper bounds).
        assert_eq!(
            left,
            ["\"key\";r=2;t=1", "\"key\";r=1;t=2", "\"key\";r=0;t=3"]
        );
        let (retry_after, limit) = refused(limits.check_key("k"));
        assert_eq!(limit.policy, "\"key\";q=3;w=3");
        assert!((1..=1).contains(&retry_after), "{retry_after}");
        assert!(
            limit.current.starts_with("\"key\";r=0;t="),
            "{}",
            limit.current
        );
    }

    #[test]
    fn addresses_have_their_own_allowance_apart_from_keys() {
        let limits = RateLimits::new(&settings(1, 1));
        let abuser = address("203.0.113.7");
        limits.check_address(abuser).unwrap();
        limits.check_address(abuser).unwrap();
        let (_, limit) = refused(limits.check_address(abuser));
        assert_eq!(limit.policy, "\"address\";q=2;w=2");
        // Another address, the same abuser's neighbour in IPv6 terms, and keys.
        limits.check_address(address("203.0.113.8")).unwrap();
        let host = address("2001:db8:1:2::1");
        limits.check_address(host).unwrap();
        limits.check_address(address("2001:db8:1:2::ffff")).unwrap();
        refused(limits.check_address(address("2001:db8:1:2:abcd::9")));
        limits.check_key("checkout").unwrap();
    }

    #[test]
    fn failed_signatures_are_limited_per_address_apart_from_the_provider() {
        let limits = RateLimits::new(&settings(1, 1));
        let attacker = address("203.0.113.7");
        for _ in 0..FAILED_SIGNATURE_BURST {
            assert!(limits.check_failed_signature(attacker).is_ok());
        }
        assert!(matches!(
            limits.check_failed_signature(attacker),
            Err(Refused { .. })
        ));
        // Another address, the provider's own bucket and the address buckets of checkout
        // keys are untouched.
        assert!(
            limits
                .check_failed_signature(address("203.0.113.8"))
                .is_ok()
        );
        assert!(limits.check_provider("stripe").is_ok());
        assert!(limits.check_address(attacker).is_ok());
    }

    /// An abuser rotating through more addresses than the table holds: the table stops
    /// growing at its cap, the newcomers share the overflow bucket, and an address
    /// remembered before keeps its own allowance.
    #[test]
    fn rotating_addresses_cannot_grow_the_table_past_its_cap() {
        let quota = Quota::per_hour(NonZeroU32::new(2).unwrap());
        let limiter = AddressLimiter::new(quota, Limiter::Address, 100);
        let shopper = address("198.51.100.1");
        limiter.check(shopper).unwrap();
        for i in 0..5_000u32 {
            let rotating = ClientAddress::of(std::net::Ipv4Addr::from(0x0a00_0000 + i).into());
            let _ = limiter.check(rotating);
        }
        assert!(limiter.limiter.len() <= 101, "{}", limiter.limiter.len());
        // The overflow bucket is spent by the rotation; the shopper's own is not.
        assert!(limiter.check(address("192.0.2.200")).is_err());
        assert!(limiter.check(shopper).is_ok());
    }
}
