//! What one payment goes through in a round of the seeded race: its quantity, its refund,
//! how many success deliveries, backend retries and checkout requests race, and the HTTP
//! answer each of them got.

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refund {
    None,
    Full,
    /// `charge.refunded` with `refunded: false` and this `amount_refunded` of AMOUNT.
    Partial(i64),
}

/// What happens to one payment in a round.
#[derive(Debug, Clone)]
pub(super) struct Scenario {
    pub(super) payment: String,
    pub(super) quantity: i64,
    pub(super) refund: Refund,
    /// Deliveries of the (one) success event: 0, 1, or 2 (a duplicate).
    pub(super) success_deliveries: u32,
    pub(super) writer_retries: u32,
    pub(super) checkout: bool,
    /// `created` of the success event; the refund's is later.
    pub(super) success_created: i64,
    pub(super) refund_created: i64,
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
        let success_deliveries = if rng.random_bool(0.8) {
            if rng.random_bool(0.3) { 2 } else { 1 }
        } else {
            0
        };
        let success_created = base - rng.random_range(0..=600);
        Scenario {
            payment: format!("pi_money_r{round}_p{p}"),
            quantity,
            refund,
            success_deliveries,
            writer_retries: rng.random_range(1..=3),
            checkout: rng.random_bool(0.5),
            success_created,
            refund_created: success_created + rng.random_range(1..=300),
        }
    }

    /// How many of its tokens (the lowest indexes) the payment stands for in the end.
    pub(super) fn keep(&self) -> i64 {
        match self.refund {
            Refund::None => self.quantity,
            Refund::Full => 0,
            Refund::Partial(refunded) => self.quantity - self.quantity * refunded / AMOUNT,
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

    fn refund_event(&self) -> Option<Value> {
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
    Refund,
    Writer,
    Checkout,
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
        Action::Refund => {
            let event = scenario.refund_event().expect("a refund scenario");
            deliver_stripe(app, &event).await
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
