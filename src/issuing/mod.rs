//! The issuing service: every business rule of tokenmint lives here, and only here.
//!
//! - who may issue: a trusted backend at once, a checkout frontend only once the provider
//!   reported the payment succeeded with the same parameters (else a pending request);
//! - payment state against issuance: nothing is issued for a payment known to have failed,
//!   been canceled or refunded, and every write of tokens is followed by a re-check of the
//!   payment, so a refund that raced the write still takes the tokens back (`standing`);
//! - provider metadata outranks a checkout's pending request;
//! - refunds, partial refunds and cancellations revoke (`standing`, `events`);
//! - the token state machine behind redeem, revoke and transfer (`tokens`);
//! - spending by amount: redemptions, all or nothing, oldest tokens first, named by
//!   their reference (`redemptions`);
//! - which attempt of a request with an `Idempotency-Key` runs, and what its retries are
//!   answered (`idempotency`);
//! - self-repair of token sets a crash left short (`repair`);
//! - who may wait for a payment's event before being answered, and for how long
//!   (`waiting`).
//!
//! HTTP handlers and the webhook receiver translate requests into calls here and the
//! results back into answers; `store` persists what is decided here and decides nothing.

mod batch;
mod events;
mod idempotency;
mod issue;
mod oplog_waiter;
mod redemptions;
mod repair;
mod standing;
mod tokens;
mod waiting;

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use events::Processed;
pub use idempotency::{Answer, Attempt, Begun, Finality, IdempotentRequest, Keyed};
pub use oplog_waiter::OplogWaiter;
pub use redemptions::{Redeemed, RedemptionError, RedemptionOutcome};
pub use repair::{RepairReport, spawn_repair};
pub use standing::{Settlement, entitlement};
pub use tokens::{Gate, Transition, TransitionOutcome};
pub use waiting::{FulfilmentWatch, Waited, WaitingConfig, longest_wait};

use crate::domain::{IssuanceMode, Mismatch, PaymentStatus, Provider, TokenPrices};
use crate::store::{IssuanceDoc, Store, StoreError, TokenSummary};

/// The rules' tunables, taken from `Settings`.
#[derive(Debug, Clone)]
pub struct IssuingConfig {
    /// The mode of an issuance that names none (and of webhook issuances).
    pub default_mode: IssuanceMode,
    /// Providers a checkout key may name: the configured ones.
    pub providers: HashSet<String>,
    /// Providers whose token metadata the customer may have written (Paddle): their
    /// payments issue only parameters a success fixed (`Issuer::usable_metadata`).
    pub customer_metadata: HashSet<String>,
    /// How long a checkout's pending request waits for the payment's success.
    pub pending_ttl: Duration,
    /// How `Idempotency-Key`s are held and kept.
    pub idempotency: IdempotencyConfig,
    /// The most batches of one mode committed at once (`issuance.max_batches_in_flight`,
    /// at least 2).
    pub max_batches_in_flight: usize,
    /// What a token of each priced type costs (`issuance.token_prices`): a provider's
    /// metadata its payment does not pay for issues nothing.
    pub prices: TokenPrices,
}

/// How `Idempotency-Key`s are held and kept.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyConfig {
    /// How long a key and its answer are kept (`idempotency.retention_hours`).
    pub retention: Duration,
    /// How long the first attempt holds its key before a retry may take it over: the
    /// longest a request may run (`server.request_timeout_ms`).
    pub lease: Duration,
}

/// Who asks for an issuance, which decides what it may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A backend key (`issuances:write`): issues at once, unless the payment is known to
    /// have failed, been canceled or refunded.
    Trusted,
    /// A checkout frontend key (`issuances:request` only): may not issue on its own word.
    Checkout,
}

/// A payment's issuance record and its tokens, in tokenIndex order.
#[derive(Debug, Clone)]
pub struct IssuedTokens {
    pub issuance: IssuanceDoc,
    pub tokens: Vec<TokenSummary>,
    /// How many tokens this call inserted.
    pub created: u32,
}

/// What an issuance request did.
#[derive(Debug)]
pub enum IssueOutcome {
    /// First write for this payment (or the take-over of a pending request).
    Created(IssuedTokens),
    /// The payment already had this issuance; a short set was completed if needed.
    Replayed(IssuedTokens),
    /// Recorded as requested; the tokens follow the payment's success event.
    Pending(IssuedTokens),
}

/// Why an issuance request was refused. Nothing was written for any of these, except
/// `PaymentNotSucceeded` after a refund that raced the write (the tokens it wrote are
/// revoked already).
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The payment has an issuance with other parameters (or the provider's metadata names
    /// others). For a checkout key the existing values are left out.
    #[error("the payment's issuance has other parameters")]
    Conflict(Vec<Mismatch>),
    /// The provider reported the payment failed, canceled or refunded.
    #[error("the payment is {}", .0.as_str())]
    PaymentNotSucceeded(PaymentStatus),
    /// A checkout key asked for a payment that only a trusted backend can issue.
    #[error("{0}")]
    NeedsTrustedIssuer(&'static str),
    /// A checkout key named a provider that is not configured.
    #[error("provider is not configured")]
    UnknownProvider,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The issuing service; cheap to clone.
#[derive(Clone)]
pub struct Issuer {
    store: Store,
    config: Arc<IssuingConfig>,
    /// Group commit's writer tasks, started on the first issuance and stopped by
    /// `stop_writers`. The writers hold clones of this `Issuer`: closing the queues, not
    /// dropping the last `Issuer`, is what ends them.
    committer: Arc<OnceLock<batch::Committer>>,
    /// Redemptions' group commit, likewise started on the first redemption and stopped
    /// by `stop_writers`.
    spender: Arc<OnceLock<redemptions::batch::Spender>>,
    /// Checkouts waiting for their payment's event (`Prefer: wait`), by payment.
    waiters: Arc<waiting::Waiters>,
    /// Documents written, counted: the load `hold_oplog_waiter` goes by.
    writes: Arc<oplog_waiter::Writes>,
}

impl Issuer {
    pub fn new(store: Store, config: IssuingConfig) -> Self {
        Self {
            store,
            config: Arc::new(config),
            committer: Arc::new(OnceLock::new()),
            spender: Arc::new(OnceLock::new()),
            waiters: Arc::new(waiting::Waiters::new(WaitingConfig::default())),
            writes: Arc::default(),
        }
    }

    fn committer(&self) -> &batch::Committer {
        self.committer.get_or_init(|| batch::Committer::start(self))
    }

    fn spender(&self) -> &redemptions::batch::Spender {
        self.spender
            .get_or_init(|| redemptions::batch::Spender::start(self))
    }

    /// Stops group commit's writer tasks at shutdown, issuances' and redemptions':
    /// requests queued before (a batch in flight, or one still gathering) are written and
    /// answered first, later ones are refused. Returns how many writers ended (none when
    /// no request ever started them). Writers still writing after `within` are aborted,
    /// as a crash would stop them.
    pub async fn stop_writers(&self, within: Duration) -> usize {
        let (issuing, spending) = tokio::join!(
            self.committer
                .get_or_init(batch::Committer::stopped)
                .stop(within),
            self.spender
                .get_or_init(redemptions::batch::Spender::stopped)
                .stop(within),
        );
        issuing + spending
    }

    /// The store underneath, for reads that involve no rule.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn default_mode(&self) -> IssuanceMode {
        self.config.default_mode
    }

    /// Whether `caller` may name `provider`: a checkout key only a configured one (its
    /// pending request could never be fulfilled otherwise), a trusted backend any. Asked
    /// while the body is validated, so that the refusal is listed with the body's other
    /// bad fields, and again before a checkout's request is recorded.
    pub fn may_name_provider(&self, caller: Caller, provider: &Provider) -> bool {
        caller == Caller::Trusted || self.config.providers.contains(provider.as_str())
    }

    /// A payment's issuance record and its tokens, if it has a record. A batch's record
    /// whose payment read is still on the way is not one yet: it may be taken back.
    pub async fn find_issuance(
        &self,
        key: &crate::domain::PaymentKey,
    ) -> Result<Option<IssuedTokens>, StoreError> {
        let Some(issuance) = self.store.find_record(key).await? else {
            return Ok(None);
        };
        if issuance.unconfirmed {
            return Ok(None);
        }
        let tokens = self.store.payment_tokens(key).await?;
        Ok(Some(IssuedTokens {
            issuance,
            tokens,
            created: 0,
        }))
    }
}
