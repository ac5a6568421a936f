//! tokenmint-bench: drives `POST /v1/issuances` closed-loop with N concurrent clients and,
//! in the same run, two database floors issued directly with the mongodb crate (the
//! per-request floor: tokenmint's design before group commit; the reference floor: one
//! unordered bulk of `$setOnInsert` upserts per issuance), then reports throughput,
//! latency, statuses, CPU per issuance of the service and of mongod, and tokenmint ÷ each
//! floor. See docs/BENCHMARKS.md; `scripts/bench.sh` is the one command.

mod cli;
mod floor;
mod http;
mod op_times;
mod procfs;
mod report;
mod service;
mod workload;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tokenmint::settings::Settings;

use crate::cli::{Cli, EnvArgs, Scenario, scenarios};

use crate::floor::{Design, Floor};
use crate::procfs::Pid;
use crate::report::{Measured, ScenarioResult};
use crate::service::{Mongo, Service};
use crate::workload::{Client, Stats, Target, Workload};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.env.client_threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let scenarios = scenarios(&cli.command);
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let load_before = procfs::load_average();
    let env = &cli.env;
    std::fs::create_dir_all(&env.work_dir)?;
    let work_dir = std::path::absolute(&env.work_dir)?;
    let needs_service = scenarios.iter().any(|s| s.service);
    if needs_service && !env.service_bin.is_file() {
        anyhow::bail!(
            "{} not found: build it with `cargo build --release --bin tokenmint` (scripts/bench.sh does)",
            env.service_bin.display()
        );
    }

    let mongo = match &env.mongo_uri {
        Some(uri) => {
            Mongo::external(uri, env.mongod_pid.or_else(procfs::find_single_mongod)).await?
        }
        None => Mongo::start(&env.mongod_bin, &work_dir.join("mongo")).await?,
    };
    eprintln!("mongod at {} (pid {:?})", mongo.uri(), mongo.pid());
    let result = run_scenarios(&scenarios, env, &mongo, &work_dir).await;
    mongo.stop(env.keep_data).await;
    let results = result?;

    let markdown = report::markdown(
        &results,
        &command_line,
        &procfs::machine_description(),
        &format!(
            "{load_before} before the run, {} after it (other work on the machine counts here)",
            procfs::load_average()
        ),
    );
    println!("{markdown}");
    if let Some(file) = &env.markdown {
        std::fs::write(file, &markdown)
            .with_context(|| format!("cannot write {}", file.display()))?;
        eprintln!("report written to {}", file.display());
    }
    Ok(())
}

async fn run_scenarios(
    scenarios: &[Scenario],
    env: &EnvArgs,
    mongo: &Mongo,
    work_dir: &Path,
) -> anyhow::Result<Vec<ScenarioResult>> {
    let run_tag = format!("{:x}", std::process::id());
    let mut results = Vec::new();
    for (index, scenario) in scenarios.iter().enumerate() {
        eprintln!(
            "\n== scenario {}/{}: {}",
            index + 1,
            scenarios.len(),
            report::scenario_name(scenario)
        );
        let result = run_scenario(index, scenario, env, mongo, work_dir, &run_tag).await?;
        eprintln!("{}", report::scenario_detail(&result));
        results.push(result);
    }
    Ok(results)
}

/// A target being measured: its clients, and whose CPU counts as "the service".
struct Arm {
    target: Target,
    clients: Vec<Client>,
    service_pid: Option<Pid>,
    measured: Measured,
}

async fn run_scenario(
    index: usize,
    scenario: &Scenario,
    env: &EnvArgs,
    mongo: &Mongo,
    work_dir: &Path,
    run_tag: &str,
) -> anyhow::Result<ScenarioResult> {
    let workload = scenario.workload;
    let tag = format!("{run_tag}_{index}");
    let service_db = format!("bench_{tag}_service");
    let store_db = format!("bench_{tag}_store");
    let floor_db = format!("bench_{tag}_floor");
    let reference_floor_db = format!("bench_{tag}_reference_floor");
    let races = workload.races > 0.0;

    let service = if scenario.service {
        let log = work_dir.join(format!("tokenmint-{index}.log"));
        let service = Service::start(
            &env.service_bin,
            mongo.uri(),
            &service_db,
            env.max_pool_size,
            &log,
        )
        .await?;
        eprintln!(
            "   tokenmint pid {} on {}, log {}",
            service.pid(),
            service.addr(),
            log.display()
        );
        Some(service)
    } else {
        None
    };
    let store = if env.with_store && scenario.service && scenario.floor {
        Some(connect_store(mongo.uri(), &store_db, env.max_pool_size).await?)
    } else {
        None
    };
    let connect_floor = |wanted: bool, database: &str, design: Design| {
        let database = database.to_owned();
        async move {
            if !wanted {
                return Ok(None);
            }
            Floor::connect(mongo.uri(), &database, env.max_pool_size, design)
                .await
                .map(Some)
        }
    };
    let floor = connect_floor(scenario.floor, &floor_db, Design::PerRequest).await?;
    let reference_floor = connect_floor(
        scenario.reference_floor,
        &reference_floor_db,
        Design::Reference,
    )
    .await?;
    let make_arm = |target: Target, service_pid: Option<Pid>| -> anyhow::Result<Arm> {
        let clients = (0..workload.concurrency)
            .map(|id| Client::new(id, env.seed, &tag, &target, races))
            .collect::<anyhow::Result<_>>()?;
        Ok(Arm {
            target,
            clients,
            service_pid,
            measured: Measured::default(),
        })
    };
    let mut arms: [Option<Arm>; 4] = [None, None, None, None];
    if let Some(s) = &service {
        let target = Target::Service {
            addr: s.addr(),
            api_key: s.api_key().to_owned(),
        };
        arms[SERVICE] = Some(make_arm(target, Some(Pid::Id(s.pid())))?);
    }
    if let Some(s) = &store {
        arms[STORE] = Some(make_arm(Target::Store(s.clone()), None)?);
    }
    if let Some(f) = &floor {
        arms[FLOOR] = Some(make_arm(Target::Floor(f.clone()), None)?);
    }
    if let Some(f) = &reference_floor {
        arms[REFERENCE_FLOOR] = Some(make_arm(Target::Floor(f.clone()), None)?);
    }

    // A warm-up of each target, then the measured segments, interleaved (see `plan`).
    for arm in arms.iter_mut().flatten() {
        eprintln!("   warm-up {}", target_name(&arm.target));
        segment(arm, workload, scenario.warmup, mongo, false).await;
    }
    for (which, duration) in plan(scenario.duration) {
        if let Some(arm) = arms[which].as_mut() {
            eprintln!(
                "   measure {} ({:.1} s)",
                target_name(&arm.target),
                duration.as_secs_f64()
            );
            segment(arm, workload, duration, mongo, true).await;
        }
    }

    let service_rss = service
        .as_ref()
        .and_then(|s| procfs::resident_bytes(Pid::Id(s.pid())));
    let mongod_rss = mongo
        .pid()
        .and_then(|pid| procfs::resident_bytes(Pid::Id(pid)));
    // Close the keep-alive connections before the service's graceful shutdown.
    if let Some(arm) = arms[SERVICE].as_mut() {
        arm.clients.clear();
    }
    if let Some(service) = service {
        service.stop().await;
    }
    if let Some(store) = store {
        store.store().clone().shutdown().await;
    }
    for floor in [floor, reference_floor].into_iter().flatten() {
        floor.shutdown().await;
    }
    if !env.keep_data {
        mongo
            .drop_databases(&[&service_db, &store_db, &floor_db, &reference_floor_db])
            .await;
    }
    let [service_arm, store_arm, floor_arm, reference_floor_arm] = arms;
    Ok(ScenarioResult {
        scenario: *scenario,
        service: service_arm.map(|arm| arm.measured),
        store: store_arm.map(|arm| arm.measured),
        floor: floor_arm.map(|arm| arm.measured),
        reference_floor: reference_floor_arm.map(|arm| arm.measured),
        service_rss,
        mongod_rss,
    })
}

/// Indexes of a scenario's targets (its arms).
const SERVICE: usize = 0;
const STORE: usize = 1;
const FLOOR: usize = 2;
const REFERENCE_FLOOR: usize = 3;

/// The measured segments of a scenario, after the warm-up: the palindrome service ½ ·
/// (store ½) · floor ½ · reference floor 1 · floor ½ · (store ½) · service ½. Each target gets
/// the full duration, centred on the middle of the scenario, so a steady drift of the
/// shared machine falls on all alike. A target the scenario does not measure is skipped.
fn plan(duration: Duration) -> [(usize, Duration); 7] {
    let first = duration / 2;
    let second = duration - first;
    [
        (SERVICE, first),
        (STORE, first),
        (FLOOR, first),
        (REFERENCE_FLOOR, duration),
        (FLOOR, second),
        (STORE, second),
        (SERVICE, second),
    ]
}

/// tokenmint's own issuing service on `database`, connected, migrated and configured as
/// the service does it with its default settings.
async fn connect_store(
    uri: &str,
    database: &str,
    max_pool_size: u32,
) -> anyhow::Result<tokenmint::issuing::Issuer> {
    let settings = service_settings(uri, database, max_pool_size)?;
    let (store, _) = tokenmint::startup::connect(&settings).await?;
    tokenmint::migrate::run(&store, false).await?;
    Ok(tokenmint::startup::issuer(&settings, store))
}

/// The service's settings as it starts with no configuration (the compiled-in defaults),
/// on `database` at `uri` with `max_pool_size` connections. The in-process store and the
/// floors connect with them, so timeouts and retry bounds are defined once.
pub fn service_settings(uri: &str, database: &str, max_pool_size: u32) -> anyhow::Result<Settings> {
    Ok(Settings::with_overrides(&[&format!(
        "[mongo]\nuri = \"{uri}\"\ndatabase = \"{database}\"\nmax_pool_size = {max_pool_size}\n"
    )])?)
}

fn target_name(target: &Target) -> &'static str {
    match target {
        Target::Service { .. } => "tokenmint",
        Target::Store(_) => "store",
        Target::Floor(floor) => floor.design().name(),
    }
}

/// Runs `arm` for `duration`; when `measure`, adds what happened to `arm.measured`.
async fn segment(
    arm: &mut Arm,
    workload: Workload,
    duration: Duration,
    mongo: &Mongo,
    measure: bool,
) {
    let cpu = |pid: Option<Pid>| pid.and_then(procfs::cpu_time);
    let mongod_pid = mongo.pid().map(Pid::Id);
    let ops_before = mongo.opcounters().await;
    let before = (
        cpu(arm.service_pid),
        cpu(mongod_pid),
        cpu(Some(Pid::Myself)),
    );
    let started = Instant::now();
    let sampler = arm
        .service_pid
        .filter(|_| measure)
        .map(|pid| tokio::spawn(sample_rss(pid, started + duration)));
    let clients = std::mem::take(&mut arm.clients);
    let (clients, stats): (Vec<Client>, Stats) =
        workload::run_segment(clients, &arm.target, workload, started + duration).await;
    arm.clients = clients;
    let rss_samples = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let elapsed = started.elapsed();
    let after = (
        cpu(arm.service_pid),
        cpu(mongod_pid),
        cpu(Some(Pid::Myself)),
    );
    let ops_after = mongo.opcounters().await;
    if !measure {
        return;
    }
    let delta = |b: Option<Duration>, a: Option<Duration>| Some(a?.saturating_sub(b?));
    let m = &mut arm.measured;
    m.elapsed += elapsed;
    m.stats.add(&stats);
    m.cpu_service = add_opt(m.cpu_service, delta(before.0, after.0));
    m.cpu_mongod = add_opt(m.cpu_mongod, delta(before.1, after.1));
    m.cpu_bench = add_opt(m.cpu_bench, delta(before.2, after.2));
    m.rss_samples.extend(rss_samples);
    if let (Some(b), Some(a)) = (ops_before, ops_after) {
        let ops = m.ops.get_or_insert([0; 6]);
        for (i, total) in ops.iter_mut().enumerate() {
            *total += a[i] - b[i];
        }
    }
}

/// VmRSS of `pid` once a second until `until` (for the memory trend of a long run).
async fn sample_rss(pid: Pid, until: Instant) -> Vec<(Instant, u64)> {
    let mut samples = Vec::new();
    let mut every_second = tokio::time::interval(Duration::from_secs(1));
    loop {
        every_second.tick().await;
        let now = Instant::now();
        if now >= until {
            return samples;
        }
        if let Some(bytes) = procfs::resident_bytes(pid) {
            samples.push((now, bytes));
        }
    }
}

fn add_opt(total: Option<Duration>, more: Option<Duration>) -> Option<Duration> {
    match (total, more) {
        (Some(t), Some(m)) => Some(t + m),
        (None, m) => m,
        (t, None) => t,
    }
}

#[cfg(test)]
mod tests {
    use tokenmint::domain::IssuanceMode;

    use super::*;
    use crate::cli::Command;

    fn matrix(quick: bool) -> Vec<Scenario> {
        scenarios(&Command::Matrix {
            quick,
            duration: None,
            warmup: None,
        })
    }

    #[test]
    fn every_target_gets_the_full_duration_centred_on_the_middle() {
        let duration = Duration::from_millis(15_001);
        let plan = plan(duration);
        let total: Duration = plan.iter().map(|(_, d)| *d).sum();
        for target in [SERVICE, STORE, FLOOR, REFERENCE_FLOOR] {
            let (mut start, mut measured, mut moment) = (0.0, 0.0, 0.0);
            for (which, segment) in plan {
                let length = segment.as_secs_f64();
                if which == target {
                    measured += length;
                    moment += length * (start + length / 2.0);
                }
                start += length;
            }
            assert!((measured - duration.as_secs_f64()).abs() < 1e-9);
            let centre = moment / measured;
            assert!((centre - total.as_secs_f64() / 2.0).abs() < 1e-3);
        }
    }

    #[test]
    fn the_matrix_measures_every_target_in_every_scenario() {
        let shape: Vec<(usize, u32, IssuanceMode, f64)> = matrix(false)
            .iter()
            .map(|s| {
                assert!(s.service && s.floor && s.reference_floor);
                assert_eq!(s.workload.races, 0.0);
                let w = s.workload;
                (w.concurrency, w.quantity, w.mode, w.replays)
            })
            .collect();
        let mut expected = Vec::new();
        for replays in [0.0, 0.5] {
            expected.push((32, 4, IssuanceMode::Upsert, replays));
        }
        for replays in [0.0, 0.5] {
            expected.push((32, 4, IssuanceMode::Atomic, replays));
        }
        for (concurrency, quantity) in [(1, 4), (256, 4), (32, 1), (32, 100)] {
            for mode in [IssuanceMode::Upsert, IssuanceMode::Atomic] {
                expected.push((concurrency, quantity, mode, 0.0));
            }
        }
        assert_eq!(shape, expected);
    }

    #[test]
    fn the_default_matrix_measures_under_thirteen_minutes() {
        // Warm-up and measured time of every target; starting the service, migrating and
        // dropping the databases add a few seconds per scenario on top.
        let seconds = |scenarios: Vec<Scenario>| -> f64 {
            scenarios
                .iter()
                .map(|s| 3.0 * (s.warmup + s.duration).as_secs_f64())
                .sum()
        };
        assert!(seconds(matrix(false)) <= 13.0 * 60.0);
        assert!(seconds(matrix(true)) <= 3.0 * 60.0);
    }
}
