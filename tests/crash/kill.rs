//! What the kill scenarios share: when to kill, an uncrashed load to time it, a load
//! ended by SIGKILL, and the checks of what an acknowledgment and the kill left.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::RngExt;
use rand::rngs::StdRng;
use tokenmint::store::VerifyReport;
use tokenmint_test_support::{Service, TokenIds, is_full_set};

use super::requests::{
    Answer, QUANTITY, Request, http_client, pick_requests, retry_until_ok, send,
};

/// Early kills come within this many milliseconds of the load's start.
const MAX_EARLY_KILL_MS: u64 = 300;

/// Counts over a scenario, for its summary line, and the violations found.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) iterations: u32,
    pub(super) kills: u32,
    pub(super) requests: u64,
    pub(super) acknowledged_before_kill: u64,
    pub(super) errors_before_kill: u64,
    pub(super) partial_sets_before_retry: u64,
    pub(super) retry_attempts: u64,
    pub(super) retry_failures: BTreeMap<u16, u64>,
    pub(super) slowest_retry: Duration,
    pub(super) late_kills: u32,
    pub(super) violations: Vec<String>,
}

impl Tally {
    /// The figures every scenario's summary line starts with.
    pub(super) fn figures(&self) -> String {
        format!(
            "iterations={} kills={} (late={}) requests={} acknowledged_before_kill={} errors_before_kill={}",
            self.iterations,
            self.kills,
            self.late_kills,
            self.requests,
            self.acknowledged_before_kill,
            self.errors_before_kill,
        )
    }

    /// Fails the scenario when its iterations found violations, naming the seed that
    /// replays it and the kill's delay; `log`, the service's log, is shown with them.
    pub(super) fn assert_clean(
        &self,
        scenario: &str,
        seed: u64,
        iteration: u32,
        delay: Duration,
        log: Option<&str>,
    ) {
        assert!(
            self.violations.is_empty(),
            "crash[{scenario}] seed {seed} iteration {iteration} (kill after {delay:?}): {} violation(s):\n{}{}",
            self.violations.len(),
            self.violations.join("\n"),
            log.map(|log| format!("\nthe restarted service's log:\n{log}"))
                .unwrap_or_default(),
        );
    }
}

/// When to kill: mostly early (0–300 ms: bulks and transactions mid-way, partial sets),
/// every third iteration (1, 4, 7, …) late: 30–110 % of the time an uncrashed load of the same size
/// took (`calibration`), so that some requests were answered before the kill. With
/// quantity 1000 hardly any request finishes within 300 ms, and "nothing acknowledged
/// lost" needs acknowledgments to check.
pub(super) fn kill_delay(rng: &mut StdRng, iteration: u32, calibration: Duration) -> Duration {
    if iteration % 3 == 1 {
        let percent = rng.random_range(30..=110);
        (calibration * percent / 100).max(Duration::from_millis(MAX_EARLY_KILL_MS + 1))
    } else {
        Duration::from_millis(rng.random_range(0..=MAX_EARLY_KILL_MS))
    }
}

/// One uncrashed load of the iterations' size against `service`, timed (late kills are a
/// fraction of it). Its payments are the database's first acknowledged ones; later
/// iterations replay some of them.
pub(super) async fn calibrate(
    rng: &mut StdRng,
    mode: &str,
    service: &Service,
    acknowledged: &mut BTreeMap<String, TokenIds>,
    tally: &mut Tally,
) -> Duration {
    let requests = pick_requests(rng, mode, "calibration", &[]);
    let http = http_client();
    let started = Instant::now();
    let answers = join_all(
        requests
            .iter()
            .cloned()
            .map(|request| retry_until_ok(http.clone(), service.base.clone(), request)),
    )
    .await;
    let took = started.elapsed();
    for retried in answers {
        match retried.result {
            Ok(ids) => record(
                acknowledged,
                tally,
                &retried.request.payment,
                ids,
                "in calibration",
            ),
            Err(err) => panic!("calibration load failed: {err}"),
        }
    }
    eprintln!(
        "crash[{mode}]: an uncrashed load of {} requests took {took:?}",
        requests.len()
    );
    took
}

/// Sends `requests` to `service` at once and SIGKILLs it after `delay`. Answers that
/// arrived before the kill are recorded (acknowledged ids, errors, 4xx as violations);
/// returns how many were acknowledged.
pub(super) async fn load_then_kill(
    service: &mut Service,
    requests: &[Request],
    delay: Duration,
    acknowledged: &mut BTreeMap<String, TokenIds>,
    tally: &mut Tally,
) -> u64 {
    let http = http_client();
    let tasks: Vec<_> = requests
        .iter()
        .cloned()
        .map(|request| {
            let http = http.clone();
            let base = service.base.clone();
            tokio::spawn(async move {
                let answer = send(&http, &base, &request.body).await;
                (request, answer)
            })
        })
        .collect();
    tokio::time::sleep(delay).await;
    service.kill();
    tally.kills += 1;
    if delay.as_millis() > u128::from(MAX_EARLY_KILL_MS) {
        tally.late_kills += 1;
    }
    let mut acked_now = 0;
    for task in join_all(tasks).await {
        let (request, answer) = task.expect("request task");
        match answer {
            Answer::Ok(ids) => {
                acked_now += 1;
                record(
                    acknowledged,
                    tally,
                    &request.payment,
                    ids,
                    "before the kill",
                );
            }
            Answer::Status(status, body) if (400..500).contains(&status) => {
                tally.violations.push(format!(
                    "{}: answered {status} before the kill: {body}",
                    request.payment
                ))
            }
            Answer::Status(..) | Answer::Failed(_) => tally.errors_before_kill += 1,
        }
    }
    tally.acknowledged_before_kill += acked_now;
    acked_now
}

/// Records an acknowledged answer; it must be a full set naming the ids every earlier
/// acknowledgment of the payment named.
pub(super) fn record(
    acknowledged: &mut BTreeMap<String, TokenIds>,
    tally: &mut Tally,
    payment: &str,
    ids: TokenIds,
    when: &str,
) {
    if !is_full_set(&ids, QUANTITY) {
        tally.violations.push(format!(
            "{payment}: acknowledged {when} with {} tokens, not tokenIndex 0..{}",
            ids.len(),
            QUANTITY - 1
        ));
        return;
    }
    match acknowledged.get(payment) {
        Some(earlier) if *earlier != ids => {
            let changed = earlier.iter().zip(&ids).filter(|(a, b)| a != b).count();
            tally.violations.push(format!(
                "{payment}: acknowledged {when} with other token ids than before ({changed} differ)"
            ));
        }
        Some(_) => {}
        None => {
            acknowledged.insert(payment.to_owned(), ids);
        }
    }
}

/// What must hold right after a kill, before any retry.
pub(super) fn check_after_kill(
    mode: &str,
    report: &VerifyReport,
    tally: &mut Tally,
    iteration: u32,
) {
    let mut broken = Vec::new();
    if report.duplicate_tokens.count > 0 {
        broken.push("duplicate tokens");
    }
    if report.orphan_tokens.count > 0 {
        broken.push("orphan tokens");
    }
    if report.tokens_without_version.count > 0 {
        broken.push("tokens without _version");
    }
    // A transaction is all or nothing: atomic mode never shows a partial set.
    if mode == "atomic" && report.wrong_token_sets.count > 0 {
        broken.push("partial token sets in atomic mode");
    }
    if !broken.is_empty() {
        tally.violations.push(format!(
            "iteration {iteration}, right after the kill: {}:\n{report}",
            broken.join(", ")
        ));
    }
}
