//! Per-caller rate limits (`[rate_limit]`): a GCRA bucket per API key id, and one per
//! webhook provider. Keys are the configured ids and provider names only — never values a
//! client can invent — so the limiter's memory is bounded.

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::error::ApiError;
use crate::settings::RateLimitSettings;

pub struct RateLimits {
    limiter: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

impl RateLimits {
    pub fn new(settings: &RateLimitSettings) -> Self {
        // Settings validation guarantees both are > 0.
        let rate = NonZeroU32::new(settings.per_key_per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(settings.burst).unwrap_or(rate);
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one request from `bucket`'s allowance, or answers 429 with the wait.
    pub fn check(&self, bucket: String) -> Result<(), ApiError> {
        self.limiter.check_key(&bucket).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            metrics::counter!("tokenmint_rate_limited_total").increment(1);
            ApiError::RateLimited {
                retry_after_secs: wait.as_secs().max(1),
            }
        })
    }
}
