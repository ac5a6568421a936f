//! The command line: the matrix or one scenario, where mongod and the service come from,
//! and the scenarios a command stands for.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokenmint::domain::IssuanceMode;
use tokenmint::settings::Settings;

use crate::workload::Workload;

#[derive(Debug, Parser)]
#[command(
    name = "tokenmint-bench",
    about = "Closed-loop benchmark of POST /v1/issuances against two MongoDB floors.",
    // A repeated option keeps its last value, so wrapper scripts can put their defaults
    // first and let the caller's options win.
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub env: EnvArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The documented matrix, both modes each: concurrency 32 quantity 4 with 0% and 50%
    /// replays; concurrency 1 (latency) and 256, quantity 4; concurrency 32 with quantity 1
    /// and 100. Every scenario measures tokenmint and both floors.
    Matrix {
        /// A smoke test: 3 s per target and scenario, 1 s warm-up.
        #[arg(long)]
        quick: bool,
        /// Measured seconds per target and scenario (default 15, quick 3).
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
pub struct RunArgs {
    /// Concurrent clients (closed loop: each waits for its answer before the next request).
    #[arg(long, short = 'c', default_value_t = 32)]
    pub concurrency: usize,
    /// Tokens per payment.
    #[arg(long, short = 'q', default_value_t = 4)]
    pub quantity: u32,
    #[arg(long, value_enum, default_value_t = ModeArg::Upsert)]
    pub mode: ModeArg,
    /// Fraction (0..1) of requests that replay a completed payment.
    #[arg(long, default_value_t = 0.0)]
    pub replays: f64,
    /// Fraction (0..1) of new payments sent twice at once (a concurrent duplicate race).
    #[arg(long, default_value_t = 0.0)]
    pub races: f64,
    /// Measured seconds per target.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Warm-up seconds per target (not measured).
    #[arg(long, default_value_t = 5.0)]
    pub warmup: f64,
    /// What to measure: tokenmint and both floors, or one of them, or both floors alone.
    #[arg(long, value_enum, default_value_t = Which::All)]
    pub target: Which,
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    /// An existing replica set to use instead of starting the pinned mongod.
    #[arg(long, global = true)]
    pub mongo_uri: Option<String>,
    /// With --mongo-uri: the PID of its mongod, for CPU figures (default: the only
    /// process named mongod, if there is exactly one).
    #[arg(long, global = true)]
    pub mongod_pid: Option<u32>,
    /// The mongod to start (default: .tools/mongodb/bin/mongod, then PATH).
    #[arg(long, global = true, default_value = "")]
    pub mongod_bin: String,
    /// The release tokenmint binary.
    #[arg(long, global = true, default_value = "target/release/tokenmint")]
    pub service_bin: PathBuf,
    /// Where the mongod data and the service logs go (emptied first).
    #[arg(long, global = true, default_value = "target/bench")]
    pub work_dir: PathBuf,
    /// Keep the databases and the mongod data directory afterwards.
    #[arg(long, global = true)]
    pub keep_data: bool,
    /// Worker threads of the bench's own runtime (HTTP clients, and the floors' driver).
    #[arg(long, global = true, default_value_t = 2)]
    pub client_threads: usize,
    /// Connection pool size of the service and of each floor (config mongo.max_pool_size;
    /// its default by default).
    #[arg(long, global = true, default_value_t = default_pool_size())]
    pub max_pool_size: u32,
    /// Also write the markdown report to this file.
    #[arg(long, global = true)]
    pub markdown: Option<PathBuf>,
    /// Seed of the request mix (the same for every target).
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
    /// Also measure tokenmint's own `Issuer::issue` in the bench process (the service
    /// without HTTP), to split the service's cost between its HTTP layer and the rest.
    #[arg(long, global = true)]
    pub with_store: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Upsert,
    Atomic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// tokenmint, the per-request floor and the reference floor.
    All,
    /// tokenmint alone.
    Service,
    /// The per-request floor alone.
    Floor,
    /// The reference floor alone.
    ReferenceFloor,
    /// Both floors, no tokenmint.
    Floors,
}

/// One scenario of a run.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub workload: Workload,
    pub duration: Duration,
    pub warmup: Duration,
    pub service: bool,
    pub floor: bool,
    pub reference_floor: bool,
}

pub fn scenarios(command: &Command) -> Vec<Scenario> {
    match command {
        Command::Matrix {
            quick,
            duration,
            warmup,
        } => {
            // 12 scenarios × 3 targets × (5 + 15) s, plus a few seconds per scenario to
            // start the service and migrate its and the floors' databases: ~14 minutes.
            let duration =
                Duration::from_secs_f64(duration.unwrap_or(if *quick { 3.0 } else { 15.0 }));
            let warmup = Duration::from_secs_f64(warmup.unwrap_or(if *quick { 1.0 } else { 5.0 }));
            let scenario = |concurrency, quantity, mode, replays| Scenario {
                workload: Workload {
                    concurrency,
                    quantity,
                    mode,
                    replays,
                    races: 0.0,
                },
                duration,
                warmup,
                service: true,
                floor: true,
                reference_floor: true,
            };
            let mut matrix = vec![
                scenario(32, 4, IssuanceMode::Upsert, 0.0),
                scenario(32, 4, IssuanceMode::Upsert, 0.5),
                scenario(32, 4, IssuanceMode::Atomic, 0.0),
                scenario(32, 4, IssuanceMode::Atomic, 0.5),
            ];
            // Latency (1 client), many clients (256), one token and 100 tokens per payment.
            for (concurrency, quantity) in [(1, 4), (256, 4), (32, 1), (32, 100)] {
                for mode in [IssuanceMode::Upsert, IssuanceMode::Atomic] {
                    matrix.push(scenario(concurrency, quantity, mode, 0.0));
                }
            }
            matrix
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
            service: matches!(args.target, Which::All | Which::Service),
            floor: matches!(args.target, Which::All | Which::Floor | Which::Floors),
            reference_floor: matches!(
                args.target,
                Which::All | Which::ReferenceFloor | Which::Floors
            ),
        }],
    }
}

/// The service's default `mongo.max_pool_size`, the bench's default too.
fn default_pool_size() -> u32 {
    Settings::with_overrides(&[])
        .expect("the compiled-in defaults are valid")
        .mongo
        .max_pool_size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(quick: bool) -> Vec<Scenario> {
        scenarios(&Command::Matrix {
            quick,
            duration: None,
            warmup: None,
        })
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
