//! The money invariant under races: tokens stand exactly while their payment stands.
//!
//! A payment the provider reported failed, canceled or refunded is issued by no key; a
//! refund, full or partial, that races the issuance (the success webhook, backend retries,
//! a checkout request) still ends with exactly the tokens the payment stands for. Every
//! check reads the database, and `Store::verify()` must stay clean.
//!
//! The race test is seeded: `TOKENMINT_RACE_SEED` replays a run's choices (timing is not
//! replayed), `TOKENMINT_RACE_ROUNDS` sets the number of rounds (default 10, of 20
//! payments each). Run it with `--nocapture` to see the seed and the summary line:
//!
//!     cargo test --test api money -- --nocapture

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use futures::future::join_all;
use mongodb::bson::{Bson, Document, doc, oid::ObjectId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::provider_events::*;

/// The amount of every charge in these tests (the intent events say 1000 too).
const AMOUNT: i64 = 1000;
const DEFAULT_ROUNDS: u32 = 10;
const PAYMENTS_PER_ROUND: usize = 20;
const MAX_QUANTITY: i64 = 40;
const MAX_START_DELAY_MS: u64 = 30;

fn as_i64(value: Option<&Bson>) -> Option<i64> {
    match value {
        Some(Bson::Int32(v)) => Some(i64::from(*v)),
        Some(Bson::Int64(v)) => Some(*v),
        _ => None,
    }
}

/// A token as stored: (tokenIndex, status, owner, type).
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredToken {
    index: i64,
    status: String,
    owner: Option<ObjectId>,
    token_type: String,
}

/// A payment's issuance records and tokens (tokenIndex order), read from the database.
async fn stored(app: &TestApp, payment: &str) -> (Vec<Document>, Vec<StoredToken>) {
    let records: Vec<Document> = app
        .db
        .collection::<Document>("issuances")
        .find(doc! { "provider": "stripe", "accountId": "acct_1", "paymentIntentId": payment })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tokens: Vec<Document> = app
        .db
        .collection::<Document>("tokens")
        .find(doc! {
            "origin.provider": "stripe", "origin.accountId": "acct_1",
            "origin.paymentIntentId": payment,
        })
        .sort(doc! { "tokenIndex": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tokens = tokens
        .iter()
        .map(|t| StoredToken {
            index: as_i64(t.get("tokenIndex")).expect("integer tokenIndex"),
            status: t.get_str("status").unwrap_or("?").to_owned(),
            owner: t.get_object_id("owner").ok(),
            token_type: t.get_str("type").unwrap_or("?").to_owned(),
        })
        .collect();
    (records, tokens)
}

async fn active_tokens(app: &TestApp, payment: &str) -> u64 {
    app.count(
        "tokens",
        doc! { "origin.paymentIntentId": payment, "status": "active" },
    )
    .await
}

// ---------------------------------------------------------------------------------------
// 1. A payment the provider reported failed, canceled or refunded is never issued.

#[tokio::test]
async fn a_refunded_canceled_or_failed_payment_is_never_issued_by_any_key() {
    let app = app().await;
    let t = now();
    let cases = [
        ("refunded", refund_event("evt_m_ref", "pi_m_refunded", t)),
        (
            "canceled",
            intent_event("evt_m_can", "canceled", "pi_m_canceled", t, "3"),
        ),
        (
            "failed",
            intent_event("evt_m_fail", "payment_failed", "pi_m_failed", t, "3"),
        ),
    ];
    for (state, event) in &cases {
        let payment = event["data"]["object"]["payment_intent"]
            .as_str()
            .or(event["data"]["object"]["id"].as_str())
            .unwrap()
            .to_owned();
        let delivered = send_stripe(&app, event, STRIPE_NEW, now()).await;
        assert_eq!(delivered.status(), 200, "{state}: the event is accepted");
        assert_eq!(payment_status(&app, &payment).await.0, *state);

        for key in [WRITER_KEY, ADMIN_KEY, REQUEST_KEY] {
            for mode in ["upsert", "atomic"] {
                let mut body = issuance_body(&payment, 3);
                body["mode"] = json!(mode);
                let problem =
                    assert_problem(app.issue(key, &body).await, 409, "payment_not_succeeded").await;
                assert!(
                    problem["detail"].as_str().unwrap_or("").contains(state),
                    "{state}, {key}, {mode}: the answer names the state: {problem}"
                );
            }
        }
        assert_eq!(
            app.count("issuances", doc! { "paymentIntentId": &payment })
                .await,
            0,
            "{state}: no issuance record"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": &payment })
                .await,
            0,
            "{state}: no token"
        );
    }

    // A success event that the provider sent before the refund or cancellation but that is
    // delivered late issues nothing either: the payment does not stand.
    for (state, payment) in [("refunded", "pi_m_refunded"), ("canceled", "pi_m_canceled")] {
        let late = intent_event(
            &format!("evt_m_late_{state}"),
            "succeeded",
            payment,
            t - 60,
            "3",
        );
        assert_eq!(
            send_stripe(&app, &late, STRIPE_NEW, now()).await.status(),
            200
        );
        assert_eq!(payment_status(&app, payment).await.0, state);
        assert_problem(
            app.issue(WRITER_KEY, &issuance_body(payment, 3)).await,
            409,
            "payment_not_succeeded",
        )
        .await;
        assert_eq!(
            app.count("issuances", doc! { "paymentIntentId": payment })
                .await,
            0,
            "{state}: no issuance record after the late success"
        );
        assert_eq!(
            app.count("tokens", doc! { "origin.paymentIntentId": payment })
                .await,
            0,
            "{state}: no token after the late success"
        );
    }
    assert_eq!(app.count("issuances", doc! {}).await, 0);
    assert_eq!(app.count("tokens", doc! {}).await, 0);
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}

// ---------------------------------------------------------------------------------------
// 2. The seeded race: success webhooks, refunds, backend retries and checkout requests.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refund {
    None,
    Full,
    /// `charge.refunded` with `refunded: false` and this `amount_refunded` of AMOUNT.
    Partial(i64),
}

/// What happens to one payment in a round.
#[derive(Debug, Clone)]
struct Scenario {
    payment: String,
    quantity: i64,
    refund: Refund,
    /// Deliveries of the (one) success event: 0, 1, or 2 (a duplicate).
    success_deliveries: u32,
    writer_retries: u32,
    checkout: bool,
    /// `created` of the success event; the refund's is later.
    success_created: i64,
    refund_created: i64,
}

impl Scenario {
    fn pick(rng: &mut StdRng, round: u32, p: usize, base: i64) -> Scenario {
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
    fn keep(&self) -> i64 {
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
enum Action {
    Success,
    Refund,
    Writer,
    Checkout,
}

/// One HTTP answer of a round.
#[derive(Debug)]
struct Answer {
    payment: usize,
    action: Action,
    delay_ms: u64,
    status: u16,
    code: Option<String>,
    body: String,
}

async fn run(
    app: &TestApp,
    scenario: &Scenario,
    payment: usize,
    action: Action,
    delay_ms: u64,
) -> Answer {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    let response = match action {
        Action::Success => send_stripe(app, &scenario.success_event(), STRIPE_NEW, now()).await,
        Action::Refund => {
            let event = scenario.refund_event().expect("a refund scenario");
            send_stripe(app, &event, STRIPE_NEW, now()).await
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

/// Everything wrong with one payment after its round: its HTTP answers and its stored
/// state.
async fn check_payment(app: &TestApp, scenario: &Scenario, answers: &[&Answer]) -> Vec<String> {
    let mut wrong = Vec::new();
    let owner = ObjectId::parse_str(OWNER).unwrap();
    let fully_refunded = scenario.refund == Refund::Full;

    // The HTTP answers.
    for answer in answers {
        let acceptable = match answer.action {
            Action::Success | Action::Refund => answer.status == 200,
            Action::Writer | Action::Checkout => match answer.status {
                200 | 201 => true,
                // A trusted key never waits for the payment.
                202 => answer.action == Action::Checkout,
                // Every request names the parameters of the payment's metadata, so the only
                // refusal is the payment's: and only a full refund withdraws it.
                409 => fully_refunded && answer.code.as_deref() == Some("payment_not_succeeded"),
                _ => false,
            },
        };
        if !acceptable {
            wrong.push(format!(
                "{:?} (after {} ms) answered {} {}",
                answer.action, answer.delay_ms, answer.status, answer.body
            ));
        }
    }
    let created = answers
        .iter()
        .filter(|a| matches!(a.action, Action::Writer | Action::Checkout) && a.status == 201)
        .count();
    if created > 1 {
        wrong.push(format!("{created} answers 201 Created for one payment"));
    }

    // The payment's state.
    let payment = app
        .db
        .collection::<Document>("payments")
        .find_one(doc! { "paymentIntentId": &scenario.payment })
        .await
        .unwrap();
    let payment_state = payment
        .as_ref()
        .map(|p| p.get_str("status").unwrap_or("?").to_owned());
    // A partial refund is no state change: without a success event the payment has
    // only its refunded amount, no status ("?").
    let expected_state = match scenario.refund {
        Refund::Full => Some("refunded"),
        Refund::Partial(_) if scenario.success_deliveries > 0 => Some("succeeded"),
        Refund::Partial(_) => Some("?"),
        Refund::None if scenario.success_deliveries > 0 => Some("succeeded"),
        Refund::None => None,
    };
    if payment_state.as_deref() != expected_state {
        wrong.push(format!(
            "payment state {payment_state:?}, expected {expected_state:?}"
        ));
    }
    if let Refund::Partial(refunded) = scenario.refund {
        let recorded = payment
            .as_ref()
            .and_then(|p| as_i64(p.get("amountRefunded")));
        if recorded != Some(refunded) {
            wrong.push(format!("amountRefunded {recorded:?}, expected {refunded}"));
        }
    }

    // The issuance record and its tokens.
    let (records, tokens) = stored(app, &scenario.payment).await;
    let active: Vec<i64> = tokens
        .iter()
        .filter(|t| t.status == "active")
        .map(|t| t.index)
        .collect();
    match records.as_slice() {
        [] => {
            // Only a full refund can keep every writer out (a backend retry always runs).
            if !fully_refunded {
                wrong.push("no issuance record for a payment that stands".to_owned());
            }
            if !tokens.is_empty() {
                wrong.push(format!("{} tokens without a record", tokens.len()));
            }
        }
        [record] => {
            let status = record.get_str("status").unwrap_or("?");
            let quantity = as_i64(record.get("quantity"));
            let record_owner = record.get_object_id("owner").ok();
            let record_type = record.get_str("tokenType").unwrap_or("?");
            if quantity != Some(scenario.quantity)
                || record_owner != Some(owner)
                || record_type != "standard"
            {
                wrong.push(format!(
                    "record has quantity {quantity:?}, owner {record_owner:?}, type {record_type}"
                ));
            }
            match status {
                "issued" => {
                    let indexes: Vec<i64> = tokens.iter().map(|t| t.index).collect();
                    if indexes != (0..scenario.quantity).collect::<Vec<_>>() {
                        wrong.push(format!(
                            "issued record of quantity {} has tokenIndexes {indexes:?}",
                            scenario.quantity
                        ));
                    }
                    if let Some(t) = tokens
                        .iter()
                        .find(|t| t.owner != record_owner || t.token_type != record_type)
                    {
                        wrong.push(format!("token not of the record's owner/type: {t:?}"));
                    }
                    // Nothing but the refund revokes here: exactly the entitled tokens stand.
                    let expected: Vec<i64> = (0..scenario.keep()).collect();
                    if active != expected {
                        wrong.push(format!(
                            "active tokenIndexes {active:?}, expected 0..{} (refund {:?})",
                            scenario.keep(),
                            scenario.refund
                        ));
                    }
                    if let Some(t) = tokens
                        .iter()
                        .find(|t| t.status != "active" && t.status != "revoked")
                    {
                        wrong.push(format!("token in an unexpected state: {t:?}"));
                    }
                }
                // A checkout's request recorded before a full refund, which then kept every
                // writer out: it never issues, and expires.
                "pending" if fully_refunded => {
                    if !tokens.is_empty() {
                        wrong.push(format!("pending record with {} tokens", tokens.len()));
                    }
                }
                other => wrong.push(format!("record left {other}")),
            }
        }
        more => wrong.push(format!("{} issuance records", more.len())),
    }
    // The invariant itself, whatever the record says.
    let keep = scenario.keep();
    if let Some(index) = active.iter().find(|&&i| i >= keep) {
        wrong.push(format!(
            "token {index} is active, but the payment stands for tokens 0..{keep} only"
        ));
    }
    wrong
}

fn seed() -> u64 {
    std::env::var("TOKENMINT_RACE_SEED")
        .ok()
        .map(|s| s.parse().expect("TOKENMINT_RACE_SEED is a u64"))
        .unwrap_or_else(rand::random)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_refund_and_retries_race_and_refunded_payments_keep_no_active_token() {
    let seed = seed();
    let rounds: u32 = std::env::var("TOKENMINT_RACE_ROUNDS")
        .ok()
        .map(|s| s.parse().expect("TOKENMINT_RACE_ROUNDS is a number"))
        .unwrap_or(DEFAULT_ROUNDS);
    println!(
        "money race: seed {seed} (TOKENMINT_RACE_SEED={seed} replays it), {rounds} rounds x {PAYMENTS_PER_ROUND} payments"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let app = app().await;
    let store = app.store().await;
    let started = Instant::now();
    let base = now();
    let mut violations: Vec<String> = Vec::new();
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    let mut rounds_run: u32 = 0;

    for round in 0..rounds {
        let scenarios: Vec<Scenario> = (0..PAYMENTS_PER_ROUND)
            .map(|p| Scenario::pick(&mut rng, round, p, base))
            .collect();
        let mut actions = Vec::new();
        for (p, s) in scenarios.iter().enumerate() {
            let mut push = |action: Action, rng: &mut StdRng| {
                actions.push((p, action, rng.random_range(0..=MAX_START_DELAY_MS)));
            };
            for _ in 0..s.success_deliveries {
                push(Action::Success, &mut rng);
            }
            if s.refund != Refund::None {
                push(Action::Refund, &mut rng);
            }
            for _ in 0..s.writer_retries {
                push(Action::Writer, &mut rng);
            }
            if s.checkout {
                push(Action::Checkout, &mut rng);
            }
        }
        let answers = join_all(
            actions
                .iter()
                .map(|&(p, action, delay)| run(&app, &scenarios[p], p, action, delay)),
        )
        .await;
        for answer in &answers {
            let code = answer.code.as_deref().unwrap_or("");
            *tally
                .entry(format!("{:?} {} {code}", answer.action, answer.status))
                .or_default() += 1;
        }

        let mut round_violations = Vec::new();
        for (p, scenario) in scenarios.iter().enumerate() {
            let mine: Vec<&Answer> = answers.iter().filter(|a| a.payment == p).collect();
            for wrong in check_payment(&app, scenario, &mine).await {
                round_violations.push(format!("round {round}, {scenario:?}: {wrong}"));
            }
        }
        let report = store.verify().await.unwrap();
        if !report.is_clean() {
            round_violations.push(format!("round {round}: verify is not clean:\n{report}"));
        }
        println!(
            "money race: round {round}: {} requests, {} violation(s), {:.1} s so far",
            answers.len(),
            round_violations.len(),
            started.elapsed().as_secs_f64()
        );
        violations.extend(round_violations);
        rounds_run += 1;
    }

    println!("money race: answers {tally:?}");
    println!(
        "money race: seed {seed}, {rounds_run} rounds x {PAYMENTS_PER_ROUND} payments = {} interleavings, {} violations, {:.1} s",
        u64::from(rounds_run) * PAYMENTS_PER_ROUND as u64,
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        violations.is_empty(),
        "seed {seed} (TOKENMINT_RACE_SEED={seed}): {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// 3. Deterministic: the success webhook and the refund at the same moment.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn issuance_that_races_a_refund_still_ends_revoked() {
    const PAYMENTS: usize = 12;
    const QUANTITY: i64 = 40;
    let app = app().await;
    let t = now();
    let payments: Vec<String> = (0..PAYMENTS).map(|p| format!("pi_money_tie_{p}")).collect();
    let answers = join_all(payments.iter().map(|payment| {
        let success = intent_event(
            &format!("evt_s_{payment}"),
            "succeeded",
            payment,
            t,
            &QUANTITY.to_string(),
        );
        let refund = refund_event(&format!("evt_r_{payment}"), payment, t + 1);
        let app = &app;
        async move {
            let (success, refund) = futures::join!(
                send_stripe(app, &success, STRIPE_NEW, now()),
                send_stripe(app, &refund, STRIPE_NEW, now())
            );
            (success.status().as_u16(), refund.status().as_u16())
        }
    }))
    .await;
    assert!(
        answers.iter().all(|&a| a == (200, 200)),
        "every delivery is accepted: {answers:?}"
    );

    for payment in &payments {
        assert_eq!(
            active_tokens(&app, payment).await,
            0,
            "{payment}: a refunded payment keeps no active token"
        );
        assert_eq!(payment_status(&app, payment).await.0, "refunded");
        let (records, tokens) = stored(&app, payment).await;
        match records.as_slice() {
            // The refund was recorded before the success event was processed: nothing issued.
            [] => assert!(tokens.is_empty(), "{payment}: tokens without a record"),
            [record] => {
                assert_eq!(record.get_str("status").unwrap(), "issued", "{payment}");
                assert_eq!(
                    tokens.iter().map(|t| t.index).collect::<Vec<_>>(),
                    (0..QUANTITY).collect::<Vec<_>>(),
                    "{payment}: the whole set, all revoked"
                );
                assert!(tokens.iter().all(|t| t.status == "revoked"), "{payment}");
            }
            more => panic!("{payment}: {} records", more.len()),
        }
        // Retries afterwards change nothing.
        assert_problem(
            app.issue(WRITER_KEY, &issuance_body(payment, QUANTITY))
                .await,
            409,
            "payment_not_succeeded",
        )
        .await;
        assert_eq!(active_tokens(&app, payment).await, 0, "{payment}");
    }
    assert_eq!(app.count("tokens", doc! { "status": "active" }).await, 0);
    let report = app.store().await.verify().await.unwrap();
    assert!(report.is_clean(), "{report}");
}
