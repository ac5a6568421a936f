//! tokenmint-bench: drives `POST /v1/issuances` closed-loop with N concurrent clients and,
//! in the same run, the same database operations issued directly (the floor), then
//! reports throughput, latency, statuses, CPU per issuance of the service and of mongod,
//! and tokenmint ÷ floor. See BENCHMARKS.md; `scripts/bench.sh` is the one command.

mod floor;
mod http;
mod procfs;
mod report;
mod service;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tokenmint::domain::IssuanceMode;

use crate::floor::Floor;
use crate::procfs::Pid;
use crate::report::{Measured, ScenarioResult};
use crate::service::{Mongo, Service};
use crate::workload::{Client, Stats, Target, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "tokenmint-bench",
    about = "Closed-loop benchmark of POST /v1/issuances against a MongoDB floor.",
    // A repeated option keeps its last value, so wrapper scripts can put their defaults
    // first and let the caller's options win.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    env: EnvArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The documented matrix: concurrency 32 quantity 4, replays 0% and 50%, both modes;
    /// concurrency 1 for latency; each with its floor.
    Matrix {
        /// A smoke test: 3 s per target and scenario, 1 s warm-up.
        #[arg(long)]
        quick: bool,
        /// Measured seconds per target and scenario (default 20, quick 3).
        #[arg(long)]
        duration: Option<f64>,
        /// Warm-up seconds per target and scenario (default 5, quick 1).
        #[arg(long)]
        warmup: Option<f64>,
    },
    /// One scenario.
    #[command(args_override_self = true)]
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Concurrent clients (closed loop: each waits for its answer before the next request).
    #[arg(long, short = 'c', default_value_t = 32)]
    concurrency: usize,
    /// Tokens per payment.
    #[arg(long, short = 'q', default_value_t = 4)]
    quantity: u32,
    #[arg(long, value_enum, default_value_t = ModeArg::Upsert)]
    mode: ModeArg,
    /// Fraction (0..1) of requests that replay a completed payment.
    #[arg(long, default_value_t = 0.0)]
    replays: f64,
    /// Fraction (0..1) of new payments sent twice at once (a concurrent duplicate race).
    #[arg(long, default_value_t = 0.0)]
    races: f64,
    /// Measured seconds per target.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Warm-up seconds per target (not measured).
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    #[arg(long, value_enum, default_value_t = Which::Both)]
    target: Which,
}

#[derive(Debug, Args)]
struct EnvArgs {
    /// An existing replica set to use instead of starting the pinned mongod.
    #[arg(long, global = true)]
    mongo_uri: Option<String>,
    /// With --mongo-uri: the PID of its mongod, for CPU figures (default: the only
    /// process named mongod, if there is exactly one).
    #[arg(long, global = true)]
    mongod_pid: Option<u32>,
    /// The mongod to start (default: .tools/mongodb/bin/mongod, then PATH).
    #[arg(long, global = true, default_value = "")]
    mongod_bin: String,
    /// The release tokenmint binary.
    #[arg(long, global = true, default_value = "target/release/tokenmint")]
    service_bin: PathBuf,
    /// Where the mongod data and the service logs go (emptied first).
    #[arg(long, global = true, default_value = "target/bench")]
    work_dir: PathBuf,
    /// Keep the databases and the mongod data directory afterwards.
    #[arg(long, global = true)]
    keep_data: bool,
    /// Worker threads of the bench's own runtime (HTTP clients, and the floor's driver).
    #[arg(long, global = true, default_value_t = 2)]
    client_threads: usize,
    /// Connection pool size of the service and of the floor (config mongo.max_pool_size).
    #[arg(long, global = true, default_value_t = 64)]
    max_pool_size: u32,
    /// Also write the markdown report to this file.
    #[arg(long, global = true)]
    markdown: Option<PathBuf>,
    /// Seed of the request mix (the same for service and floor).
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// Also measure tokenmint's own `Store::issue` in the bench process (the service
    /// without HTTP), to split the service's cost between its HTTP layer and its store.
    #[arg(long, global = true)]
    with_store: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Upsert,
    Atomic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Both,
    Service,
    Floor,
}

/// One scenario of a run.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub workload: Workload,
    pub duration: Duration,
    pub warmup: Duration,
    service: bool,
    floor: bool,
}

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

fn scenarios(command: &Command) -> Vec<Scenario> {
    match command {
        Command::Matrix {
            quick,
            duration,
            warmup,
        } => {
            let duration =
                Duration::from_secs_f64(duration.unwrap_or(if *quick { 3.0 } else { 20.0 }));
            let warmup = Duration::from_secs_f64(warmup.unwrap_or(if *quick { 1.0 } else { 5.0 }));
            let scenario = |concurrency, mode, replays| Scenario {
                workload: Workload {
                    concurrency,
                    quantity: 4,
                    mode,
                    replays,
                    races: 0.0,
                },
                duration,
                warmup,
                service: true,
                floor: true,
            };
            vec![
                scenario(32, IssuanceMode::Upsert, 0.0),
                scenario(32, IssuanceMode::Upsert, 0.5),
                scenario(32, IssuanceMode::Atomic, 0.0),
                scenario(32, IssuanceMode::Atomic, 0.5),
                scenario(1, IssuanceMode::Upsert, 0.0),
                scenario(1, IssuanceMode::Atomic, 0.0),
            ]
        }
        Command::Run(args) => vec![Scenario {
            workload: Workload {
                concurrency: args.concurrency.max(1),
                quantity: args.quantity.max(1),
                mode: match args.mode {
                    ModeArg::Upsert => IssuanceMode::Upsert,
                    ModeArg::Atomic => IssuanceMode::Atomic,
                },
                replays: args.replays.clamp(0.0, 1.0),
                races: args.races.clamp(0.0, 1.0),
            },
            duration: Duration::from_secs_f64(args.duration),
            warmup: Duration::from_secs_f64(args.warmup),
            service: args.target != Which::Floor,
            floor: args.target != Which::Service,
        }],
    }
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
    let floor = if scenario.floor {
        Some(Floor::connect(mongo.uri(), &floor_db, env.max_pool_size).await?)
    } else {
        None
    };
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
    const SERVICE: usize = 0;
    const STORE: usize = 1;
    const FLOOR: usize = 2;
    let mut arms: [Option<Arm>; 3] = [None, None, None];
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

    // Warm-up, then service ½ · (store ½) · floor 1 · (store ½) · service ½: each target
    // gets the full duration, and a drift of the shared machine falls on all alike.
    for arm in arms.iter_mut().flatten() {
        eprintln!("   warm-up {}", target_name(&arm.target));
        segment(arm, workload, scenario.warmup, mongo, false).await;
    }
    let first = scenario.duration / 2;
    let second = scenario.duration - first;
    let plan = [
        (SERVICE, first),
        (STORE, first),
        (FLOOR, scenario.duration),
        (STORE, second),
        (SERVICE, second),
    ];
    for (which, duration) in plan {
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
    if let Some(floor) = floor {
        floor.shutdown().await;
    }
    if !env.keep_data {
        mongo
            .drop_databases(&[&service_db, &store_db, &floor_db])
            .await;
    }
    let [service_arm, store_arm, floor_arm] = arms;
    Ok(ScenarioResult {
        scenario: *scenario,
        service: service_arm.map(|arm| arm.measured),
        store: store_arm.map(|arm| arm.measured),
        floor: floor_arm.map(|arm| arm.measured),
        service_rss,
        mongod_rss,
    })
}

/// tokenmint's own issuing service on `database`, migrated as the service migrates its own.
async fn connect_store(
    uri: &str,
    database: &str,
    max_pool_size: u32,
) -> anyhow::Result<tokenmint::issuing::Issuer> {
    let store = tokenmint::store::Store::connect(
        uri,
        database,
        Duration::from_millis(2000),
        max_pool_size,
        tokenmint::store::StoreConfig::default(),
    )
    .await?;
    tokenmint::migrate::run(&store, false).await?;
    let config = tokenmint::issuing::IssuingConfig {
        default_mode: IssuanceMode::Upsert,
        providers: Default::default(),
        pending_ttl: Duration::from_secs(7 * 86_400),
    };
    Ok(tokenmint::issuing::Issuer::new(store, config))
}

fn target_name(target: &Target) -> &'static str {
    match target {
        Target::Service { .. } => "tokenmint",
        Target::Store(_) => "store",
        Target::Floor(_) => "floor",
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
