//! What one payment goes through in a round of the seeded races: its quantity, its refund,
//! the money that may come back (the refund failing, a dispute withdrawn and won), how
//! many success deliveries (of its PaymentIntent's event and of its Checkout
//! Session's), backend retries and checkout requests race, the redemption by amount that
//! may race them (spending the owner's oldest tokens, of this payment or any other), the
//! seeded order and timing of those requests, and the HTTP answer each of them got.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;
use serde_json::Value;

use crate::helpers::*;
use crate::provider_events::*;

/// The amount of every charge in these tests (the intent events say 1000 too).
const AMOUNT: i64 = 1000;
/// The most tokens one payment of the race buys.
const MAX_QUANTITY: i64 = 40;
/// The most tokens one redemption of the race spends.
const MAX_SPEND: i64 = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refund {
    None,
    Full,
    /// `charge.refunded` with `refunded: false` and this `amount_refunded` of AMOUNT.
    Partial(i64),
}

/// Money that comes back in a round, racing everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reversal {
    None,
    /// The round's refund fails: `refund.failed` gives its whole amount back.
    RefundFails,
    /// A dispute of this amount is withdrawn (`charge.dispute.funds_withdrawn`) and won
    /// (`funds_reinstated`), the two in either order.
    DisputeWon(i64),
}

/// What happens to one payment in a round.
#[derive(Debug, Clone)]
pub(super) struct Scenario {
    pub(super) payment: String,
    pub(super) quantity: i64,
    pub(super) refund: Refund,
    pub(super) reversal: Reversal,
    /// Deliveries of the (one) success event: 0, 1, or 2 (a duplicate).
    pub(super) success_deliveries: u32,
    /// Deliveries of the payment's Checkout Session completing paid (the same success,
    /// reported through the session, with the same metadata): 0, 1, or 2.
    pub(super) session_deliveries: u32,
    pub(super) writer_retries: u32,
    pub(super) checkout: bool,
    /// How many of the owner's tokens a redemption sent in the payment's round spends
    /// (oldest first, whichever payments they are of); 0: none is sent.
    pub(super) spend: i64,
    /// `created` of the success event; the refund's is later.
    pub(super) success_created: i64,
    pub(super) refund_created: i64,
    /// The (partial) refund was delivered and settled long before the round: only the
    /// issuance requests race (see [`Scenario::refund_long_before`]).
    pub(super) refunded_before: bool,
}

impl Scenario {
    pub(super) fn pick(rng: &mut StdRng, round: u32, p: usize, base: i64) -> Scenario {
        let quantity = rng.random_range(1..=MAX_QUANTITY);
        let refund = if rng.random_bool(0.7) {
            if rng.random_bool(0.5) {
                Refund::Full
            } else {
                Refund::Partial(rng.random_range(1..AMOUNT))
            }
        } else {
            Refund::None
        };
        let deliveries = |rng: &mut StdRng, p: f64| {
            if rng.random_bool(p) {
                if rng.random_bool(0.3) { 2 } else { 1 }
            } else {
                0
            }
        };
        let success_deliveries = deliveries(rng, 0.8);
        let session_deliveries = deliveries(rng, 0.4);
        let success_created = base - rng.random_range(0..=600);
        // Money comes back only to a payment that was paid (a success is delivered).
        let paid = success_deliveries + session_deliveries > 0;
        let reversal = match rng.random_range(0..4) {
            0 if paid && refund != Refund::None => Reversal::RefundFails,
            1 if paid => Reversal::DisputeWon(rng.random_range(1..AMOUNT)),
            _ => Reversal::None,
        };
        let checkout = rng.random_bool(0.5);
        Scenario {
            payment: format!("pi_money_r{round}_p{p}"),
            quantity,
            refund,
            reversal,
            success_deliveries,
            session_deliveries,
            writer_retries: rng.random_range(1..=3),
            checkout,
            spend: if rng.random_bool(0.3) {
                rng.random_range(1..=MAX_SPEND)
            } else {
                0
            },
            success_created,
            refund_created: success_created + rng.random_range(1..=300),
            refunded_before: false,
        }
        .without_stranded_checkout()
    }

    /// No checkout request for a payment withdrawn whole for a while and then given
    /// back: its success may have been held back meanwhile (`terminal`), and a payment
    /// standing again does not replay it, so a checkout's pending request would stay
    /// pending beside a succeeded payment — what `verify` reports (check 5) and a trusted
    /// backend resolves, not a race outcome to assert.
    fn without_stranded_checkout(mut self) -> Self {
        if self.may_be_refunded() && self.reversal != Reversal::None {
            self.checkout = false;
        }
        self
    }

    /// Makes this a payment partly refunded long before anyone issued for it, with no
    /// success event: the refund's placeholder has expired and the refund is older than
    /// the sweep of recent withdrawals looks back, so the settle after the issuance's
    /// token write is all that takes the refunded share back. The refund takes at least
    /// a third, so that most quantities lose a token to it.
    pub(super) fn refund_long_before(&mut self, rng: &mut StdRng) {
        self.refund = Refund::Partial(rng.random_range(AMOUNT / 3..AMOUNT));
        self.reversal = Reversal::None;
        self.success_deliveries = 0;
        self.session_deliveries = 0;
        self.refunded_before = true;
    }

    /// How many of its tokens the payment stands for in the end: a
    /// failed refund gives everything back, a dispute won leaves the refund alone.
    pub(super) fn keep(&self) -> i64 {
        match (self.refund, self.reversal) {
            (_, Reversal::RefundFails) | (Refund::None, _) => self.quantity,
            (Refund::Full, _) => 0,
            (Refund::Partial(refunded), _) => self.quantity - self.quantity * refunded / AMOUNT,
        }
    }

    /// Whether the payment ends withdrawn whole: a full refund that did not fail.
    pub(super) fn ends_refunded(&self) -> bool {
        self.refund == Refund::Full && self.reversal != Reversal::RefundFails
    }

    /// Whether the payment may be withdrawn whole for a while (and refuse issuances
    /// then): a full refund, or a dispute (which names no payment amount: before the
    /// success or the refund names it, a withdrawal of unknown share is all of it).
    pub(super) fn may_be_refunded(&self) -> bool {
        self.refund == Refund::Full || matches!(self.reversal, Reversal::DisputeWon(_))
    }

    /// The refunds and chargebacks recorded in the end (`amountRefunded`): money coming
    /// back does not lower it.
    pub(super) fn amount_refunded(&self) -> i64 {
        let disputed = match self.reversal {
            Reversal::DisputeWon(disputed) => disputed,
            _ => 0,
        };
        self.refunded_amount() + disputed
    }

    /// The refund's failure (`refund.failed` of all of it, after it) or the dispute's
    /// two events, when the round has them.
    fn reversal_event(&self, action: Action) -> Value {
        let created = self.refund_created + 5;
        let (event_type, object) = match (action, self.reversal) {
            (Action::RefundFails, _) => (
                "refund.failed",
                // Made when its charge's report says (`created`): its failure gives back
                // only once that report is in, whichever comes first here.
                serde_json::json!({ "id": format!("re_{}", self.payment), "object": "refund",
                    "amount": self.refunded_amount(), "charge": "ch_1", "currency": "eur",
                    "payment_intent": self.payment, "status": "failed",
                    "created": self.refund_created }),
            ),
            (Action::DisputeWithdrawn | Action::DisputeWon, Reversal::DisputeWon(amount)) => (
                if action == Action::DisputeWon {
                    "charge.dispute.funds_reinstated"
                } else {
                    "charge.dispute.funds_withdrawn"
                },
                serde_json::json!({ "id": format!("du_{}", self.payment), "object": "dispute",
                    "amount": amount, "charge": "ch_1", "currency": "eur",
                    "payment_intent": self.payment,
                    "status": if action == Action::DisputeWon { "won" } else { "needs_response" } }),
            ),
            other => panic!("no reversal event for {other:?}"),
        };
        serde_json::json!({ "id": format!("evt_{action:?}_{}", self.payment), "type": event_type,
            "created": created, "account": "acct_1", "data": { "object": object } })
    }

    fn refunded_amount(&self) -> i64 {
        match self.refund {
            Refund::None => 0,
            Refund::Full => AMOUNT,
            Refund::Partial(refunded) => refunded,
        }
    }

    fn success_event(&self) -> Value {
        intent_event(
            &format!("evt_s_{}", self.payment),
            "succeeded",
            &self.payment,
            self.success_created,
            &self.quantity.to_string(),
        )
    }

    /// Whether a success is reported in the round, by the PaymentIntent or the session.
    pub(super) fn succeeds(&self) -> bool {
        self.success_deliveries + self.session_deliveries > 0
    }

    /// The session's `checkout.session.completed`, paid, a second after the
    /// PaymentIntent's success, with the same token metadata.
    fn session_event(&self) -> Value {
        let metadata = serde_json::json!({ "tokenmint_owner": OWNER,
            "tokenmint_token_type": "standard", "tokenmint_quantity": self.quantity.to_string() });
        session_event(
            &format!("evt_cs_{}", self.payment),
            "completed",
            &self.payment,
            "paid",
            self.success_created + 1,
            metadata,
        )
    }

    pub(super) fn refund_event(&self) -> Option<Value> {
        let id = format!("evt_r_{}", self.payment);
        match self.refund {
            Refund::None => None,
            Refund::Full => Some(refund_event(&id, &self.payment, self.refund_created)),
            Refund::Partial(refunded) => Some(partial_refund_event(
                &id,
                &self.payment,
                self.refund_created,
                AMOUNT,
                refunded,
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Success,
    /// The success reported by the payment's Checkout Session.
    Session,
    Refund,
    /// The refund's failure.
    RefundFails,
    DisputeWithdrawn,
    DisputeWon,
    Writer,
    Checkout,
    /// A redemption by amount of the owner's standard tokens (`Scenario::spend`).
    Redemption,
}

impl Action {
    /// Whether this is a provider event (answered 200 whatever it does).
    pub(super) fn is_event(self) -> bool {
        !matches!(self, Self::Writer | Self::Checkout | Self::Redemption)
    }
}

/// The requests of a round, in the order drawn from `rng`: (payment number, action, start
/// delay of at most `max_delay_ms`). A refund delivered before the round is not among them.
pub(super) fn round_actions(
    scenarios: &[Scenario],
    rng: &mut StdRng,
    max_delay_ms: u64,
) -> Vec<(usize, Action, u64)> {
    let mut actions = Vec::new();
    for (p, s) in scenarios.iter().enumerate() {
        let mut push = |action: Action, rng: &mut StdRng| {
            actions.push((p, action, rng.random_range(0..=max_delay_ms)));
        };
        for _ in 0..s.success_deliveries {
            push(Action::Success, rng);
        }
        for _ in 0..s.session_deliveries {
            push(Action::Session, rng);
        }
        if s.refund != Refund::None && !s.refunded_before {
            push(Action::Refund, rng);
        }
        match s.reversal {
            Reversal::None => {}
            Reversal::RefundFails => push(Action::RefundFails, rng),
            Reversal::DisputeWon(_) => {
                push(Action::DisputeWithdrawn, rng);
                push(Action::DisputeWon, rng);
            }
        }
        for _ in 0..s.writer_retries {
            push(Action::Writer, rng);
        }
        if s.checkout {
            push(Action::Checkout, rng);
        }
        if s.spend > 0 {
            push(Action::Redemption, rng);
        }
    }
    actions
}

/// One HTTP answer of a round.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) payment: usize,
    pub(super) action: Action,
    pub(super) delay_ms: u64,
    pub(super) status: u16,
    pub(super) code: Option<String>,
    pub(super) body: String,
}

/// Runs `action` of payment number `payment` after `delay_ms`, and keeps its answer.
pub(super) async fn run(
    app: &TestApp,
    scenario: &Scenario,
    payment: usize,
    action: Action,
    delay_ms: u64,
) -> Answer {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    let response = match action {
        Action::Success => deliver_stripe(app, &scenario.success_event()).await,
        Action::Session => deliver_stripe(app, &scenario.session_event()).await,
        Action::Refund => {
            let event = scenario.refund_event().expect("a refund scenario");
            deliver_stripe(app, &event).await
        }
        Action::RefundFails | Action::DisputeWithdrawn | Action::DisputeWon => {
            deliver_stripe(app, &scenario.reversal_event(action)).await
        }
        Action::Writer => {
            app.issue(
                WRITER_KEY,
                &issuance_body(&scenario.payment, scenario.quantity),
            )
            .await
        }
        Action::Checkout => {
            app.issue(
                REQUEST_KEY,
                &issuance_body(&scenario.payment, scenario.quantity),
            )
            .await
        }
        Action::Redemption => app
            .http
            .post(app.url("/v1/redemptions"))
            .bearer_auth(ADMIN_KEY)
            .json(&serde_json::json!({
                "owner": OWNER, "tokenType": "standard", "quantity": scenario.spend,
                "reference": format!("spend-{}", scenario.payment),
            }))
            .send()
            .await
            .expect("request sent"),
    };
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned));
    Answer {
        payment,
        action,
        delay_ms,
        status,
        code,
        body,
    }
}

/// Counts `answers` by action, status and problem code, for a race's summary.
pub(super) fn tally(counts: &mut BTreeMap<String, u64>, answers: &[Answer]) {
    for answer in answers {
        let code = answer.code.as_deref().unwrap_or("");
        *counts
            .entry(format!("{:?} {} {code}", answer.action, answer.status))
            .or_default() += 1;
    }
}
