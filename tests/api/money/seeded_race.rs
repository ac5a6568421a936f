//! The seeded race: success webhooks, refunds, backend retries, checkout requests and
//! redemptions by amount, in random order and timing, round after round; then every
//! payment's answers and stored state, and every redemption, are checked. It runs once per issuance mode (the app's default mode, so the
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
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::race_check::{Faults, check_payment, check_redemptions, rounds, seed};
use super::race_scenario::{Answer, Scenario, round_actions, run, tally};
use crate::helpers::*;
use crate::provider_events::*;

/// Rounds when `TOKENMINT_RACE_ROUNDS` is not set.
const DEFAULT_ROUNDS: u32 = 10;
/// Payments racing in one round.
const PAYMENTS_PER_ROUND: usize = 20;
/// The longest a request waits before it starts, so that the requests interleave.
const MAX_START_DELAY_MS: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_refund_and_retries_race_and_refunded_payments_keep_no_active_token_upsert() {
    race("upsert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_refund_and_retries_race_and_refunded_payments_keep_no_active_token_atomic() {
    race("atomic").await;
}

async fn race(mode: &str) {
    let seed = seed("TOKENMINT_RACE_SEED");
    let rounds = rounds("TOKENMINT_RACE_ROUNDS", DEFAULT_ROUNDS);
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
    let mut answer_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut rounds_run: u32 = 0;

    for round in 0..rounds {
        let scenarios: Vec<Scenario> = (0..PAYMENTS_PER_ROUND)
            .map(|p| Scenario::pick(&mut rng, round, p, base))
            .collect();
        let actions = round_actions(&scenarios, &mut rng, MAX_START_DELAY_MS);
        let answers = join_all(
            actions
                .iter()
                .map(|&(p, action, delay)| run(&app, &scenarios[p], p, action, delay)),
        )
        .await;
        tally(&mut answer_counts, &answers);

        let mut round_violations = Vec::new();
        for (p, scenario) in scenarios.iter().enumerate() {
            let mine: Vec<&Answer> = answers.iter().filter(|a| a.payment == p).collect();
            for wrong in check_payment(&app, mode, scenario, &mine, Faults::None).await {
                round_violations.push(format!("round {round}, {scenario:?}: {wrong}"));
            }
        }
        for wrong in check_redemptions(&app).await {
            round_violations.push(format!("round {round}: {wrong}"));
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

    println!("money race ({mode}): answers {answer_counts:?}");
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
