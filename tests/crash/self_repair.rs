//! Self-repair instead of retries (`crash_upsert_self_repair_…`): after each kill the
//! service is restarted with fast self-repair and no request is sent; it must finish
//! every set the kill left short on its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};
use tokenmint::store::Store;
use tokenmint_test_support::{ScratchDatabase, Service, TokenIds};

use super::kill::{Tally, calibrate, check_after_kill, kill_delay, load_then_kill};
use super::requests::{http_client, pick_requests, stored_ids};
use super::{ITERATIONS_PER_DATABASE, begin};

/// The instance restarted by the self-repair scenario sweeps every 500 ms, and counts a
/// record older than 1 s as abandoned.
pub(super) const FAST_REPAIR: [(&str, &str); 2] = [
    ("TOKENMINT__REPAIR__INTERVAL_MS", "500"),
    ("TOKENMINT__REPAIR__MIN_AGE_MS", "1000"),
];
/// How long the restarted instance may take to finish every record a kill left.
pub(super) const REPAIR_DEADLINE: Duration = Duration::from_secs(60);

/// Self-repair instead of retries (upsert mode): after each kill the service is restarted
/// with `FAST_REPAIR` and NO request is sent. Within `REPAIR_DEADLINE` the service alone
/// must finish every `issuing` record the kill left (counted by its
/// `tokenmint_repairs_total{outcome="completed"}`); then `verify` must be clean and every
/// payment acknowledged before the kill must still hold exactly the ids it was told.
///
/// The loaded (killed) instance keeps the default repair settings: a sweep with a 1 s
/// minimum age would lease records of requests still in flight, and a lease held by a
/// killed instance keeps every other one off that record for a minute.
pub(super) async fn scenario() {
    const MODE: &str = "upsert";
    let (seed, iterations, mut rng) = begin("self-repair");
    let mut tally = Tally::default();
    let mut acknowledged: BTreeMap<String, TokenIds> = BTreeMap::new();
    let mut databases: Vec<ScratchDatabase> = Vec::new();
    let mut service: Option<Service> = None;
    let mut calibration = Duration::ZERO;
    let (mut unfinished_records, mut repairs_completed, mut tokens_by_repair) = (0, 0, 0);
    let (mut repair_time, mut slowest_repair) = (Duration::ZERO, Duration::ZERO);

    for iteration in 0..iterations {
        // A fresh database every few iterations, as in the retry scenarios.
        if iteration % ITERATIONS_PER_DATABASE == 0 {
            drop(service.take());
            let scratch = ScratchDatabase::create("tokenmint_crash").await;
            acknowledged.clear();
            let started = Service::start(scratch.name());
            databases.push(scratch);
            calibration = calibrate(&mut rng, MODE, &started, &mut acknowledged, &mut tally).await;
            service = Some(started);
        }
        let store = databases.last().expect("a database").store();
        let database = store.database().name().to_owned();
        let mut loaded = service.take().unwrap_or_else(|| Service::start(&database));
        let earlier: Vec<String> = acknowledged.keys().cloned().collect();
        let requests = pick_requests(&mut rng, MODE, &format!("r{iteration}"), &earlier);
        let delay = kill_delay(&mut rng, iteration, calibration);
        tally.requests += requests.len() as u64;

        // 1. Load, then SIGKILL after the delay.
        let acked_now =
            load_then_kill(&mut loaded, &requests, delay, &mut acknowledged, &mut tally).await;

        // 2. What the kill left.
        let before = store.verify().await.expect("verify after the kill");
        check_after_kill(MODE, &before, &mut tally, iteration);
        tally.partial_sets_before_retry += before.wrong_token_sets.count;
        let unfinished = issuing_records_once_still(store).await;
        unfinished_records += unfinished;

        // 3. Restart with fast self-repair, send nothing, and wait for the service to
        // finish every `issuing` record.
        let started = Instant::now();
        let repairer = Service::start_with(&database, &FAST_REPAIR);
        let left = wait_for_self_repair(store).await;
        let took = started.elapsed();
        repair_time += took;
        slowest_repair = slowest_repair.max(took);
        if left > 0 {
            tally.violations.push(format!(
                "{left} record(s) still issuing {took:?} after the restart; service log:\n{}",
                repairer.recent_log()
            ));
        }

        // 4. The service's own account: at least one completed repair, counted and logged,
        // per record the kill left `issuing` (more when a write the killed process had
        // sent reached mongod after the count). Both follow the record's `issued` mark,
        // so they are polled for a moment.
        let caught_up = Instant::now() + Duration::from_secs(10);
        let reported = loop {
            let reported = RepairsReported::of(&repairer).await;
            let complete =
                reported.completed >= unfinished && reported.logged >= reported.completed;
            if complete || Instant::now() > caught_up {
                break reported;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        repairs_completed += reported.completed;
        tokens_by_repair += reported.tokens_created;
        if reported.completed < unfinished
            || reported.logged < reported.completed
            || reported.failed > 0
        {
            tally.violations.push(format!(
                "{unfinished} record(s) left issuing, but the service reported {reported:?}"
            ));
        }
        // Then the database: clean, and every acknowledged id kept.
        let after = store.verify().await.expect("verify after self-repair");
        if !after.is_clean() {
            tally.violations.push(format!(
                "iteration {iteration}: verify after self-repair:\n{after}"
            ));
        }
        let mut payments: Vec<&String> = requests.iter().map(|r| &r.payment).collect();
        payments.dedup();
        for payment in payments {
            let Some(told) = acknowledged.get(payment.as_str()) else {
                continue;
            };
            let stored = stored_ids(store, payment).await;
            if stored != *told {
                tally.violations.push(format!(
                    "{payment}: stored tokens ({} of them) differ from the ids acknowledged before the kill",
                    stored.len()
                ));
            }
        }
        if std::env::var_os("TOKENMINT_CRASH_VERBOSE").is_some() {
            eprintln!(
                "crash[self-repair] iteration {iteration}; the repairing service's log:\n{}",
                repairer.recent_log()
            );
        }
        drop(repairer);
        tally.iterations += 1;
        eprintln!(
            "crash[self-repair] iteration {}/{iterations}: {} requests, killed after {} ms, {acked_now} acknowledged before the kill, {} partial set(s) and {unfinished} issuing record(s) left, {left} still issuing {} ms after the restart (no request sent), {} violation(s) after",
            iteration + 1,
            requests.len(),
            delay.as_millis(),
            before.wrong_token_sets.count,
            took.as_millis(),
            after.violations(),
        );
        tally.assert_clean("self-repair", seed, iteration, delay, None);
    }
    drop(service);
    let databases_used = databases.len();
    drop(databases);
    eprintln!(
        "crash[self-repair] summary: seed={seed} {} partial_sets_after_kill={} issuing_records_after_kill={} repairs_completed={} tokens_written_by_repair={} repair_ms_mean={} repair_ms_slowest={} retries=0 databases={databases_used} violations={}",
        tally.figures(),
        tally.partial_sets_before_retry,
        unfinished_records,
        repairs_completed,
        tokens_by_repair,
        (repair_time / tally.iterations.max(1)).as_millis(),
        slowest_repair.as_millis(),
        tally.violations.len(),
    );
}

/// How many issuance records are still `issuing`.
pub(super) async fn issuing_records(store: &Store) -> u64 {
    store
        .database()
        .collection::<Document>("issuances")
        .count_documents(doc! { "status": "issuing" })
        .await
        .expect("count issuing records")
}

/// How many records are `issuing` once two counts 300 ms apart agree (at most ten tries).
/// A command the killed process had sent can still run after the kill (mongod reads it
/// from the closed connection's buffer), and a mark that lands after the count would
/// leave the restarted service one repair fewer than counted.
async fn issuing_records_once_still(store: &Store) -> u64 {
    let mut last = issuing_records(store).await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = issuing_records(store).await;
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Waits (at most `REPAIR_DEADLINE`) until no record is `issuing`; how many still are.
pub(super) async fn wait_for_self_repair(store: &Store) -> u64 {
    let started = Instant::now();
    loop {
        let left = issuing_records(store).await;
        if left == 0 || started.elapsed() > REPAIR_DEADLINE {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The log line of each completed repair.
const REPAIRED: &str = "repaired an unfinished issuance";

/// What a service reports of its repairs: `tokenmint_repairs_total{outcome}` and the
/// repair lines of its recent log (with their `tokens_created`). An iteration leaves at
/// most `PAYMENTS_PER_ITERATION` records to repair, well within the 40 lines kept.
#[derive(Debug)]
pub(super) struct RepairsReported {
    pub(super) completed: u64,
    pub(super) failed: u64,
    pub(super) logged: u64,
    pub(super) tokens_created: u64,
}

impl RepairsReported {
    async fn of(service: &Service) -> RepairsReported {
        let metrics = http_client()
            .get(format!("{}/metrics", service.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        let counter = |outcome: &str| {
            let prefix = format!("tokenmint_repairs_total{{outcome=\"{outcome}\"}} ");
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .map_or(0, |value| {
                    value.trim().parse::<f64>().expect("a number") as u64
                })
        };
        let log = service.recent_log();
        let repaired: Vec<&str> = log.lines().filter(|line| line.contains(REPAIRED)).collect();
        let tokens_created = repaired
            .iter()
            .filter_map(|line| line.split("tokens_created=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        RepairsReported {
            completed: counter("completed"),
            failed: counter("failed"),
            logged: repaired.len() as u64,
            tokens_created,
        }
    }
}
