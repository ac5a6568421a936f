//! The seeded race: success webhooks, refunds, backend retries and checkout requests, in
//! random order and timing, round after round; then every payment's answers and stored
//! state are checked. It runs once per issuance mode (the app's default mode, so the
//! success webhooks and the backend issue in that mode).
//!
//! `TOKENMINT_RACE_SEED` replays a run's choices (timing is not replayed),
//! `TOKENMINT_RACE_ROUNDS` sets the number of rounds (default 10, of 20 payments each). Run
//! it with `--nocapture` to see the seed and the summary line:
//!
//!     cargo test --test api money -- --nocapture

use std::collections::BTreeMap;
use std::time::Instant;

use futures::future::join_all;
use mongodb::bson::{Document, doc, oid::ObjectId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::race_scenario::{Action, Answer, Refund, Scenario, run};
use super::stored;
use crate::helpers::*;
use crate::provider_events::*;

/// Rounds when `TOKENMINT_RACE_ROUNDS` is not set.
const DEFAULT_ROUNDS: u32 = 10;
/// Payments racing in one round.
const PAYMENTS_PER_ROUND: usize = 20;
/// The longest a request waits before it starts, so that the requests interleave.
const MAX_START_DELAY_MS: u64 = 30;

/// Everything wrong with one payment after its round: its HTTP answers and its stored
/// state.
async fn check_payment(
    app: &TestApp,
    mode: &str,
    scenario: &Scenario,
    answers: &[&Answer],
) -> Vec<String> {
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
            .and_then(|p| stored_int(p, "amountRefunded"));
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
            let quantity = stored_int(record, "quantity");
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
                    let record_mode = record.get_str("mode").unwrap_or("?");
                    if record_mode != mode {
                        wrong.push(format!("issued in {record_mode} mode, not {mode}"));
                    }
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

/// `TOKENMINT_RACE_SEED`, or a new random seed.
fn seed() -> u64 {
    std::env::var("TOKENMINT_RACE_SEED")
        .ok()
        .map(|s| s.parse().expect("TOKENMINT_RACE_SEED is a u64"))
        .unwrap_or_else(rand::random)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_refund_and_retries_race_and_refunded_payments_keep_no_active_token_upsert() {
    race("upsert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_refund_and_retries_race_and_refunded_payments_keep_no_active_token_atomic() {
    race("atomic").await;
}

async fn race(mode: &str) {
    let seed = seed();
    let rounds: u32 = std::env::var("TOKENMINT_RACE_ROUNDS")
        .ok()
        .map(|s| s.parse().expect("TOKENMINT_RACE_ROUNDS is a number"))
        .unwrap_or(DEFAULT_ROUNDS);
    println!(
        "money race ({mode}): seed {seed} (TOKENMINT_RACE_SEED={seed} replays it), {rounds} rounds x {PAYMENTS_PER_ROUND} payments"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let app = spawn_app_with(&format!(
        "{PROVIDERS}\n[issuance]\ndefault_mode = \"{mode}\"\n"
    ))
    .await;
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
            for wrong in check_payment(&app, mode, scenario, &mine).await {
                round_violations.push(format!("round {round}, {scenario:?}: {wrong}"));
            }
        }
        let report = store.verify().await.unwrap();
        if !report.is_clean() {
            round_violations.push(format!("round {round}: verify is not clean:\n{report}"));
        }
        println!(
            "money race ({mode}): round {round}: {} requests, {} violation(s), {:.1} s so far",
            answers.len(),
            round_violations.len(),
            started.elapsed().as_secs_f64()
        );
        violations.extend(round_violations);
        rounds_run += 1;
    }

    println!("money race ({mode}): answers {tally:?}");
    println!(
        "money race ({mode}): seed {seed}, {rounds_run} rounds x {PAYMENTS_PER_ROUND} payments = {} interleavings, {} violations, {:.1} s",
        u64::from(rounds_run) * PAYMENTS_PER_ROUND as u64,
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        violations.is_empty(),
        "{mode}, seed {seed} (TOKENMINT_RACE_SEED={seed}): {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}
