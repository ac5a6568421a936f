//! The seeded fault race: the seeded race's payments (success webhooks, full and partial
//! refunds, backend retries, checkout requests, redemptions, in random order and timing), sent to a
//! "faulty" instance while MongoDB fails its commands, once per issuance mode.
//!
//! Per round, the seed picks one `failCommand` failpoint (the server has one, so failpoint
//! tests take turns) aimed at the faulty instance's client name, and the moment it is set:
//! an outage's error code on the commands the flows send, a closed connection, a held-up
//! command, for a seeded number of times; or a crash (from that moment none of the
//! instance's commands reaches the database, and it is stopped once its requests answered).
//! Some payments were partly refunded long before the round, with no success event: their
//! placeholder has expired and the refund is older than the sweep of recent withdrawals
//! looks back, so the settle after the issuance's token write is all that takes the
//! refunded share back.
//!
//! Once the round's requests answered, the failpoint is off, and what a provider and a
//! backend would do follows on a healthy instance of the same database: every request
//! answered 5xx is sent again until it is answered otherwise. That instance repairs
//! (fast), and once no record is `issuing` every payment is checked as in the seeded race
//! (answers, records, tokens: exactly what the payment stands for) and `verify` must find
//! nothing new. A 5xx is allowed during the faults, but never with the driver's words in it.
//!
//! `TOKENMINT_FAULT_SEED` replays a run's choices (timing is not replayed),
//! `TOKENMINT_FAULT_ROUNDS` sets the number of rounds (default 3, of 10 payments each):
//!
//!     TOKENMINT_FAULT_ROUNDS=100 cargo test --test api fault_race -- --nocapture

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use mongodb::bson::{DateTime, Document, doc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokenmint::store::PLACEHOLDER_LIFETIME;

use super::race_check::{Faults, check_payment, check_redemptions, rounds, seed};
use super::race_scenario::{Answer, Scenario, round_actions, run, tally};
use crate::helpers::*;
use crate::provider_events::*;

/// Rounds when `TOKENMINT_FAULT_ROUNDS` is not set: CI runs the default.
const DEFAULT_ROUNDS: u32 = 3;
/// Payments racing in one round.
const PAYMENTS_PER_ROUND: usize = 10;
/// The longest a request waits before it starts, so that the requests interleave.
const MAX_START_DELAY_MS: u64 = 30;
/// The share of a round's payments partly refunded long before the round.
const REFUNDED_BEFORE: f64 = 0.3;
/// The healthy instance sweeps every 200 ms; records older than 500 ms count as abandoned.
const FAST_REPAIR: &str = "[repair]\ninterval_ms = 200\nmin_age_ms = 500\n";
/// The faulty instance does not repair: what it leaves is the healthy instance's to finish.
const NO_REPAIR: &str = "[repair]\nenabled = false\n";
/// How long a request answered 5xx is sent again to the healthy instance, at most: a
/// transaction the crashed instance left open holds its payments until the server's
/// transaction lifetime (60 s) ends, and an atomic issuance of them answers 503 until then.
const RESEND_WITHIN: Duration = Duration::from_secs(90);
/// The pause between two resends of a request.
const RESEND_PAUSE: Duration = Duration::from_millis(500);
/// How long the healthy instance may take to leave no record `issuing`.
const QUIESCENCE_WITHIN: Duration = Duration::from_secs(30);
/// After the last `issuing` record is gone, long enough for a few more sweeps (the sweep
/// of recent withdrawals among them) before the checks.
const SWEEPS_AFTER: Duration = Duration::from_millis(1000);

/// The commands the flows send: claims and tokens (`insert`, `update`), reads (`find`),
/// upserts of payments and holds (`findAndModify`), the count of a settle (`aggregate`),
/// and atomic mode's commits.
const FLOW_COMMANDS: [&str; 6] = [
    "insert",
    "update",
    "find",
    "findAndModify",
    "aggregate",
    "commitTransaction",
];

/// What MongoDB does to the faulty instance in one round.
#[derive(Debug, Clone)]
enum Injection {
    /// The next `times` of `commands` fail as `fault` says.
    Fail {
        commands: Vec<&'static str>,
        fault: Fault,
        times: i64,
    },
    /// The instance dies: from then on every command it sends has its connection closed.
    Crash,
}

/// A round's injection and when it starts, after the round's first requests.
#[derive(Debug, Clone)]
struct Plan {
    injection: Injection,
    at_ms: u64,
}

impl Plan {
    /// Faults that model an outage (a failover's or a shutdown's codes, which the driver
    /// retries once and the service answers 503; a lost connection; a slow node), a write
    /// conflict inside atomic mode's transactions (retried by the service), and now and
    /// then an unexpected server answer (2 BadValue: no retry, a 500).
    fn pick(rng: &mut StdRng, mode: &str) -> Plan {
        let at_ms = rng.random_range(0..=MAX_START_DELAY_MS + 20);
        if rng.random_bool(0.1) {
            return Plan {
                injection: Injection::Crash,
                at_ms,
            };
        }
        let atomic = mode == "atomic";
        // Upsert mode sends no transaction to commit.
        let usable = if atomic {
            &FLOW_COMMANDS[..]
        } else {
            &FLOW_COMMANDS[..5]
        };
        let (fault, usable) = match rng.random_range(0..9) {
            0 => (Fault::error(91), usable),
            1 => (Fault::error(11600), usable),
            2 => (Fault::error(10107), usable),
            3 => (Fault::error(189), usable),
            4 | 5 => (Fault::CloseConnection, usable),
            6 => (
                Fault::Block {
                    millis: rng.random_range(100..=1500),
                },
                usable,
            ),
            // WriteConflict means something only inside a transaction.
            7 if atomic => (
                Fault::Error {
                    code: 112,
                    labels: vec!["TransientTransactionError".to_owned()],
                },
                &["insert", "commitTransaction"][..],
            ),
            _ => (Fault::error(2), usable),
        };
        let mut commands = vec![usable[rng.random_range(0..usable.len())]];
        if rng.random_bool(0.3) {
            let second = usable[rng.random_range(0..usable.len())];
            if !commands.contains(&second) {
                commands.push(second);
            }
        }
        Plan {
            injection: Injection::Fail {
                commands,
                fault,
                times: rng.random_range(1..=4),
            },
            at_ms,
        }
    }

    /// Sets the failpoint on the clients named `app_name` in `turn`, after the plan's
    /// delay.
    async fn inject(&self, turn: FailPointTurn, app_name: &str) -> FailPoint {
        tokio::time::sleep(Duration::from_millis(self.at_ms)).await;
        match &self.injection {
            Injection::Fail {
                commands,
                fault,
                times,
            } => turn.set(app_name, commands, fault.clone(), *times).await,
            Injection::Crash => {
                turn.always(app_name, &FLOW_COMMANDS, Fault::CloseConnection)
                    .await
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_faults_during_the_money_race_leave_exactly_the_standing_tokens_upsert() {
    fault_race("upsert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mongodb_faults_during_the_money_race_leave_exactly_the_standing_tokens_atomic() {
    fault_race("atomic").await;
}

async fn fault_race(mode: &str) {
    let seed = seed("TOKENMINT_FAULT_SEED");
    let rounds = rounds("TOKENMINT_FAULT_ROUNDS", DEFAULT_ROUNDS);
    println!(
        "fault race ({mode}): seed {seed} (TOKENMINT_FAULT_SEED={seed} replays it), {rounds} rounds x {PAYMENTS_PER_ROUND} payments"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let config = format!("{PROVIDERS}\n[issuance]\ndefault_mode = \"{mode}\"\n");
    let healthy = spawn_app_with(&format!("{config}{FAST_REPAIR}")).await;
    let store = healthy.store().await;
    let started = Instant::now();
    let base = now();
    let mut violations: Vec<String> = Vec::new();
    let mut answer_counts: BTreeMap<String, u64> = BTreeMap::new();
    let (mut fired_total, mut crashes, mut rounds_run) = (0_i64, 0_u32, 0_u32);
    let mut verify_violations = 0;

    for round in 0..rounds {
        let mut scenarios: Vec<Scenario> = (0..PAYMENTS_PER_ROUND)
            .map(|p| Scenario::pick(&mut rng, round, p, base))
            .collect();
        for scenario in &mut scenarios {
            if rng.random_bool(REFUNDED_BEFORE) {
                scenario.refund_long_before(&mut rng);
            }
        }
        for scenario in scenarios.iter().filter(|s| s.refunded_before) {
            refund_long_ago(&healthy, scenario).await;
        }
        let actions = round_actions(&scenarios, &mut rng, MAX_START_DELAY_MS);
        let plan = Plan::pick(&mut rng, mode);

        let name = unique_app_name();
        let faulty =
            spawn_app_on_named(&name, &healthy.db_name, &format!("{config}{NO_REPAIR}")).await;
        // Taken before the requests start, so that the failpoint is set at its moment.
        let turn = FailPointTurn::take().await;
        let requests = join_all(
            actions
                .iter()
                .map(|&(p, action, delay)| run(&faulty, &scenarios[p], p, action, delay)),
        );
        let (mut answers, failpoint) = tokio::join!(requests, plan.inject(turn, &name));
        // Stopped before the failpoint is off: a crashed instance sends nothing more.
        faulty.stop().await;
        let fired = failpoint.off().await;
        fired_total += fired;
        if matches!(plan.injection, Injection::Crash) {
            crashes += 1;
        }
        tally(&mut answer_counts, &answers);

        let mut round_violations = Vec::new();
        let resent = resend_failed(&healthy, &scenarios, &answers).await;
        for answer in resent.iter().filter(|a| a.status >= 500) {
            round_violations.push(format!(
                "round {round}, {:?}: {:?} still answered {} after {RESEND_WITHIN:?} of resends to the healthy instance: {}",
                scenarios[answer.payment], answer.action, answer.status, answer.body
            ));
        }
        answers.extend(resent);
        if let Err(issuing) = quiesce(&healthy).await {
            round_violations.push(format!(
                "round {round}: {issuing} record(s) still issuing after {QUIESCENCE_WITHIN:?}"
            ));
        }
        for (p, scenario) in scenarios.iter().enumerate() {
            let mine: Vec<&Answer> = answers.iter().filter(|a| a.payment == p).collect();
            // One violation per payment, with everything wrong with it and its answers.
            let wrong = check_payment(&healthy, mode, scenario, &mine, Faults::Injected).await;
            if !wrong.is_empty() {
                round_violations.push(format!(
                    "round {round} ({plan:?}, fired {fired}), {scenario:?}: {}; its answers (the resends last): {}",
                    wrong.join("; "),
                    answers_of(&mine)
                ));
            }
        }
        for wrong in check_redemptions(&healthy).await {
            round_violations.push(format!("round {round}: {wrong}"));
        }
        // The database keeps every round's payments: only what is new counts again.
        let report = store.verify().await.unwrap();
        if report.violations() > verify_violations {
            round_violations.push(format!("round {round}: verify is not clean:\n{report}"));
        }
        verify_violations = report.violations();
        for wrong in &round_violations {
            println!("fault race ({mode}): {wrong}");
        }
        println!(
            "fault race ({mode}): round {round}: {plan:?} fired {fired} time(s); {} requests, {} violation(s), {:.1} s so far",
            answers.len(),
            round_violations.len(),
            started.elapsed().as_secs_f64()
        );
        violations.extend(round_violations);
        rounds_run += 1;
    }

    println!("fault race ({mode}): answers {answer_counts:?}");
    println!(
        "fault race ({mode}): seed {seed}, {rounds_run} rounds x {PAYMENTS_PER_ROUND} payments = {} interleavings, {fired_total} faults fired ({crashes} crashes), {} violations, {:.1} s",
        u64::from(rounds_run) * PAYMENTS_PER_ROUND as u64,
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        violations.is_empty(),
        "{mode}, seed {seed} (TOKENMINT_FAULT_SEED={seed}): {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// Delivers `scenario`'s partial refund to `app`, then makes it as old as a refund whose
/// placeholder has expired: the placeholder removed (as the TTL monitor does after its
/// lifetime) and the payment last changed twice that long ago, long before the sweep of
/// recent withdrawals looks back.
async fn refund_long_ago(app: &TestApp, scenario: &Scenario) {
    let event = scenario.refund_event().expect("a refund scenario");
    let delivered = deliver_stripe(app, &event).await;
    assert_eq!(delivered.status(), 200, "{scenario:?}: the early refund");
    let payment = &scenario.payment;
    app.db
        .collection::<Document>("issuances")
        .delete_one(doc! { "paymentIntentId": payment, "status": "placeholder" })
        .await
        .unwrap();
    let long_ago = DateTime::from_millis(
        DateTime::now().timestamp_millis() - 2 * PLACEHOLDER_LIFETIME.as_millis() as i64,
    );
    app.db
        .collection::<Document>("payments")
        .update_one(
            doc! { "paymentIntentId": payment },
            doc! { "$set": { "createdAt": long_ago, "updatedAt": long_ago } },
        )
        .await
        .unwrap();
}

/// What the provider and the backend do about the requests answered 5xx: send them again,
/// to the healthy instance, until they are answered otherwise (for at most
/// `RESEND_WITHIN`, all at once). Returns the last answer of each.
async fn resend_failed(app: &TestApp, scenarios: &[Scenario], answers: &[Answer]) -> Vec<Answer> {
    let started = Instant::now();
    let failed = answers.iter().filter(|a| a.status >= 500);
    join_all(failed.map(|failed| async move {
        let scenario = &scenarios[failed.payment];
        loop {
            let answer = run(app, scenario, failed.payment, failed.action, 0).await;
            if answer.status < 500 || started.elapsed() >= RESEND_WITHIN {
                return answer;
            }
            tokio::time::sleep(RESEND_PAUSE).await;
        }
    }))
    .await
}

/// Waits until no record of `app`'s database is `issuing` (self-repair finished what the
/// faults left), then for a few more sweeps; `Err(count)` if some still are.
async fn quiesce(app: &TestApp) -> Result<(), u64> {
    let started = Instant::now();
    loop {
        let issuing = app.count("issuances", doc! { "status": "issuing" }).await;
        if issuing == 0 {
            tokio::time::sleep(SWEEPS_AFTER).await;
            return Ok(());
        }
        if started.elapsed() >= QUIESCENCE_WITHIN {
            return Err(issuing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `answers` in short, for a violation's report: action, start delay, status, code.
fn answers_of(answers: &[&Answer]) -> String {
    let shown: Vec<String> = answers
        .iter()
        .map(|a| {
            let code = a.code.as_deref().unwrap_or("");
            format!("{:?}@{}ms {} {code}", a.action, a.delay_ms, a.status)
        })
        .collect();
    shown.join(", ")
}
