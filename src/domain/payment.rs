//! A payment's state as the provider last reported it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{IssuanceParams, PaymentKey, ReleaseReport, Reversal, TokensBought};

/// The payment states tokenmint distinguishes. Their `rank` orders them for providers
/// without an object version (Stripe): a state never moves to a lower rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PaymentStatus {
    Processing,
    Failed,
    Succeeded,
    Canceled,
    Refunded,
}

impl PaymentStatus {
    /// processing and failed (a failed attempt can be retried) < succeeded and canceled
    /// (terminal for the attempt) < refunded.
    pub fn rank(self) -> i64 {
        match self {
            Self::Processing | Self::Failed => 1,
            Self::Succeeded | Self::Canceled => 2,
            Self::Refunded => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Failed => "failed",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
            Self::Refunded => "refunded",
        }
    }
}

/// A verified event that concerns a payment.
#[derive(Debug, Clone)]
pub struct PaymentEvent {
    pub event_id: String,
    pub event_type: String,
    pub key: PaymentKey,
    pub status: PaymentStatus,
    /// Monotonic per payment: a lower version never overwrites a higher one.
    pub version: i64,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    /// The tokens the payment buys: `None` without tokenmint metadata, `Err` when the
    /// metadata is there but invalid (the reason, for operators).
    pub token_params: Option<Result<IssuanceParams, String>>,
    pub payment_date: Option<DateTime<Utc>>,
    /// The refund or chargeback a refund event reports; `None` for other events.
    pub refund: Option<Refund>,
    /// The money a reversal event reports coming back (a dispute won, a refund that
    /// failed, a chargeback reversed); `None` for other events. Such an event moves no
    /// state of its own: its effect is the entitlement the money leaves.
    pub reversal: Option<Reversal>,
    /// One capture of an authorised payment (Adyen under manual capture, which may
    /// capture in parts); `None` for other events. The payment's amount is then what its
    /// captures add up to, so such an event names no `amount` of its own.
    pub capture: Option<CapturedPart>,
    /// What a success left uncaptured of its amount (a Stripe PaymentIntent captured in
    /// part: `amount_received` below `amount`, the rest released to the cardholder), as a
    /// withdrawal of its own (`uncaptured:` kind): the payment stands only for what was
    /// captured, as if that part had been refunded. Or what a capture the card scheme
    /// rejected never took (Adyen's `CAPTURE_FAILED`, `capture_failed:` kind). Recorded
    /// whatever else becomes of the event. `None` for other events.
    pub uncaptured: Option<Refund>,
    /// An authorisation the provider will capture later (Adyen under manual capture): not
    /// the payment's success, but the event whose parameters the capture issues, so its
    /// parameters are fixed like a success's.
    pub authorises_capture: bool,
    /// The provider names token metadata on this event alone (an Adyen authorisation,
    /// whose metadata it does not sign): what it names fixes the parameters, nothing or
    /// unusable metadata included, since the only other way to name any is a replay of
    /// it with the metadata changed.
    pub sole_metadata: bool,
    /// The customer may have written the token metadata (Paddle's `custom_data`, which
    /// Paddle.js sets in the browser): where prices are configured, a token type it names
    /// must have one (`TokenPrices::unpaid`), and only what a success fixed is issued.
    pub customer_metadata: bool,
    /// The tokens the payment's items bought, where the provider maps its prices to
    /// token packs (Paddle's `token_packs`): the metadata may name no more than these
    /// (`TokensBought::short_of`). `None` where it maps none, or the event reports no
    /// transaction.
    pub bought: Option<TokensBought>,
}

impl PaymentEvent {
    /// Whether this event fixes the payment's token parameters: the first success that
    /// names valid ones does, and so does an authorisation that a capture will turn into
    /// the success (the capture names none); one that is its payment's `sole_metadata`
    /// fixes them whatever it names.
    pub fn fixes_params(&self) -> bool {
        (self.status == PaymentStatus::Succeeded || self.authorises_capture)
            && (self.sole_metadata || matches!(self.token_params, Some(Ok(_))))
    }
}

/// One capture of a payment, under its own id: a replay counts once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedPart {
    pub id: String,
    /// Minor units captured.
    pub amount: i64,
}

/// One refund (or chargeback) of a payment, as a refund event reports it.
///
/// Providers differ in what a refund event's amount means: Stripe reports a charge's
/// refunds so far, Paddle and Adyen the amount of that one refund. Either way the amount
/// only grows per `id`, so the payment keeps one amount per id and the refunded total is
/// their sum: two refunds add up, and a redelivered one counts once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// Names this refund among the payment's refunds, with its kind so that ids of two
    /// kinds never collide: `refund:…`, `adjustment:…`, `dispute:…`, `charge:…`,
    /// `uncaptured:…`, `capture_failed:…`.
    pub id: String,
    /// Minor units this refund gives back (a Stripe charge: its refunds so far); `None`
    /// when the provider names none, which can only be read as everything.
    pub amount: Option<i64>,
    /// `Some(true)`: the provider says the whole payment is refunded (or charged back);
    /// `Some(false)`: it says part of it, which holds only until the refunds add up to
    /// the payment's amount; `None`: the amounts decide.
    pub full: Option<bool>,
    /// For a running total (a Stripe charge's refunds so far): when the provider reported
    /// it (unix seconds). A refund that failed before then is already left out of it.
    pub reported_at: Option<i64>,
    /// For a running total of a charge captured in part (Stripe's): what the report says
    /// of the release of the uncaptured rest, which the total may hold (the same money as
    /// the payment's `uncaptured:` withdrawal, counted once between them).
    pub release: Option<ReleaseReport>,
}

/// What an event body turned out to be.
#[derive(Debug, Clone)]
pub enum ParsedEvent {
    /// Boxed: an event of a payment is several times the size of an ignored one.
    Payment(Box<PaymentEvent>),
    /// Verified, but nothing tokenmint acts on (unhandled type, partial refund, …).
    Ignored {
        event_id: String,
        event_type: String,
        reason: String,
    },
}

impl ParsedEvent {
    pub fn event_id(&self) -> &str {
        match self {
            Self::Payment(e) => &e.event_id,
            Self::Ignored { event_id, .. } => event_id,
        }
    }

    pub fn event_type(&self) -> &str {
        match self {
            Self::Payment(e) => &e.event_type,
            Self::Ignored { event_type, .. } => event_type,
        }
    }

    /// The same event, ignored for `reason` whatever it reported.
    pub fn ignored(self, reason: &str) -> Self {
        Self::Ignored {
            event_id: self.event_id().to_owned(),
            event_type: self.event_type().to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// Whether the event may issue tokens: a success (or an authorisation a capture will
    /// turn into one), not a withdrawal nor money coming back.
    pub fn may_issue(&self) -> bool {
        match self {
            Self::Payment(e) => {
                (e.status == PaymentStatus::Succeeded || e.authorises_capture)
                    && e.refund.is_none()
                    && e.reversal.is_none()
            }
            Self::Ignored { .. } => false,
        }
    }

    /// The same event, ignored for `reason`, recorded as `{event id}#{suffix}`, apart
    /// from the event's own id, so that a later delivery under that id is still applied.
    /// For a reason that rests on a field the signature does not cover (`suffix` names
    /// it): anyone holding a copy of the signed event can alter that field, and
    /// recorded under the event's own id, such a copy would make the genuine delivery
    /// that follows it a duplicate, its effects never applied. For a reason that rests
    /// on the settings (`account`): the provider's resend once they change is applied.
    pub fn ignored_apart(self, suffix: &str, reason: &str) -> Self {
        Self::Ignored {
            event_id: format!("{}#{suffix}", self.event_id()),
            event_type: self.event_type().to_owned(),
            reason: reason.to_owned(),
        }
    }
}

impl PaymentStatus {
    /// The states in which the provider has taken the payment back or never took it.
    pub const ENTITLED_TO_NOTHING: [Self; 3] = [Self::Failed, Self::Canceled, Self::Refunded];

    /// Whether the provider has taken the payment back or never took it: no token of it
    /// may be issued, and any it has are revoked — refunded, canceled, or failed (a
    /// capture the card scheme rejected after the payment was reported paid).
    pub fn forbids_issuance(self) -> bool {
        Self::ENTITLED_TO_NOTHING.contains(&self)
    }
}

/// What processing one provider event did, as answered to the provider and recorded in
/// `webhook_events`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventOutcome {
    /// `issued`, `already_issued`, `revoked`, `reinstated`, `recorded`, `stale`, `ignored`,
    /// `metadata_invalid`, `no_metadata`, `conflict`, `terminal`, `metadata_conflict`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Tokens inserted by this event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_created: Option<u32>,
    /// Active tokens revoked by this event (a refund, partial refund or cancellation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_revoked: Option<u64>,
    /// Tokens a withdrawal had revoked that this event made active again, because money
    /// came back (a reversal) or the payment stands again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_reactivated: Option<u64>,
    /// What of the share the refund takes back no unspent token was left for: tokens
    /// already redeemed stay redeemed, and the merchant is short of this many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shortfall: Option<u64>,
}

impl EventOutcome {
    pub fn new(outcome: &str) -> Self {
        Self {
            outcome: outcome.to_owned(),
            ..Self::default()
        }
    }

    pub fn with_detail(outcome: &str, detail: impl Into<String>) -> Self {
        Self {
            detail: Some(detail.into()),
            ..Self::new(outcome)
        }
    }
}
