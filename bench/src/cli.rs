//! The command line: the matrix or one scenario, where mongod and the service come from,
//! and the scenarios a command stands for.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokenmint::domain::IssuanceMode;
use tokenmint::settings::Settings;

use crate::workload::{Operation, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "tokenmint-bench",
    about = "Closed-loop benchmark of POST /v1/issuances against two MongoDB floors, and of POST /v1/redemptions beside issuances.",
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
    /// and 100. Every scenario measures tokenmint and both floors. With `--workload
    /// redeem`: redemptions of 1 and 10 tokens at concurrency 1 and 32, 30% retries, each
    /// after an issuance scenario of the same shape.
    Matrix {
        /// A smoke test: 3 s per target and scenario, 1 s warm-up.
        #[arg(long)]
        quick: bool,
        /// What the matrix measures.
        #[arg(long, value_enum, default_value_t = WorkloadArg::Issue)]
        workload: WorkloadArg,
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
    /// `issue`: POST /v1/issuances. `redeem`: POST /v1/redemptions of each client's own
    /// tokens (issued beforehand, not measured), after an issuance scenario of the same
    /// concurrency, quantity and replay share; both against the service alone.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Issue)]
    pub workload: WorkloadArg,
    /// Concurrent clients (closed loop: each waits for its answer before the next request).
    #[arg(long, short = 'c', default_value_t = 32)]
    pub concurrency: usize,
    /// Tokens per payment (per redemption, with `--workload redeem`).
    #[arg(long, short = 'q', default_value_t = 4)]
    pub quantity: u32,
    #[arg(long, value_enum, default_value_t = ModeArg::Upsert)]
    pub mode: ModeArg,
    /// Fraction (0..1) of requests that replay a completed payment, or (`--retries`, the
    /// same option) that retry a completed redemption's reference.
    #[arg(long, alias = "retries", default_value_t = 0.0)]
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

/// What a scenario sends (`--workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadArg {
    /// Issuances.
    Issue,
    /// Redemptions, each scenario after an issuance scenario of the same shape.
    Redeem,
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

/// The scenarios `command` stands for, in order.
pub fn scenarios(command: &Command) -> Vec<Scenario> {
    match command {
        Command::Matrix {
            quick,
            workload: WorkloadArg::Redeem,
            duration,
            warmup,
        } => {
            let (duration, warmup) = matrix_times(*quick, *duration, *warmup);
            let mut matrix = Vec::new();
            for concurrency in [1, 32] {
                for quantity in [1, 10] {
                    let workload = Workload {
                        operation: Operation::Redeem,
                        concurrency,
                        quantity,
                        mode: IssuanceMode::Upsert,
                        replays: 0.3,
                        races: 0.0,
                    };
                    matrix.extend(redemption_pair(workload, duration, warmup));
                }
            }
            matrix
        }
        Command::Matrix {
            quick,
            workload: WorkloadArg::Issue,
            duration,
            warmup,
        } => {
            // 12 scenarios × 3 targets × (5 + 15) s, plus a few seconds per scenario to
            // start the service and migrate its and the floors' databases: ~14 minutes.
            let (duration, warmup) = matrix_times(*quick, *duration, *warmup);
            let scenario = |concurrency, quantity, mode, replays| Scenario {
                workload: Workload {
                    operation: Operation::Issue,
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
        Command::Run(args) if args.workload == WorkloadArg::Redeem => {
            let workload = Workload {
                operation: Operation::Redeem,
                concurrency: args.concurrency.max(1),
                quantity: args.quantity.max(1),
                mode: mode(args.mode),
                replays: args.replays.clamp(0.0, 1.0),
                races: 0.0,
            };
            redemption_pair(
                workload,
                Duration::from_secs_f64(args.duration),
                Duration::from_secs_f64(args.warmup),
            )
            .to_vec()
        }
        Command::Run(args) => vec![Scenario {
            workload: Workload {
                operation: Operation::Issue,
                concurrency: args.concurrency.max(1),
                quantity: args.quantity.max(1),
                mode: mode(args.mode),
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

fn mode(mode: ModeArg) -> IssuanceMode {
    match mode {
        ModeArg::Upsert => IssuanceMode::Upsert,
        ModeArg::Atomic => IssuanceMode::Atomic,
    }
}

/// A matrix's measured and warm-up time per scenario: as given, else 15 s and 5 s, or
/// 3 s and 1 s for a `--quick` run that only checks the matrix still runs.
fn matrix_times(quick: bool, duration: Option<f64>, warmup: Option<f64>) -> (Duration, Duration) {
    let (default_duration, default_warmup) = if quick { (3.0, 1.0) } else { (15.0, 5.0) };
    (
        Duration::from_secs_f64(duration.unwrap_or(default_duration)),
        Duration::from_secs_f64(warmup.unwrap_or(default_warmup)),
    )
}

/// A redemption scenario and, first, the issuance scenario it is read beside: the same
/// concurrency, quantity and replay share, the same run. Both against the service alone,
/// since the floors only issue.
fn redemption_pair(redeem: Workload, duration: Duration, warmup: Duration) -> [Scenario; 2] {
    let service_only = |workload| Scenario {
        workload,
        duration,
        warmup,
        service: true,
        floor: false,
        reference_floor: false,
    };
    let issue = Workload {
        operation: Operation::Issue,
        ..redeem
    };
    [service_only(issue), service_only(redeem)]
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
            workload: WorkloadArg::Issue,
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
    fn each_redemption_scenario_follows_an_issuance_of_the_same_shape() {
        let redeem = scenarios(&Command::Matrix {
            quick: false,
            workload: WorkloadArg::Redeem,
            duration: None,
            warmup: None,
        });
        assert_eq!(redeem.len(), 8);
        let mut shapes = Vec::new();
        for pair in redeem.chunks(2) {
            let [issue, redemption] = pair else {
                unreachable!("chunks of two")
            };
            assert_eq!(issue.workload.operation, Operation::Issue);
            assert_eq!(redemption.workload.operation, Operation::Redeem);
            for s in pair {
                assert!(s.service && !s.floor && !s.reference_floor);
                assert_eq!(s.workload.replays, 0.3);
            }
            let shape = |s: &Scenario| (s.workload.concurrency, s.workload.quantity);
            assert_eq!(shape(issue), shape(redemption));
            shapes.push(shape(redemption));
        }
        assert_eq!(shapes, [(1, 1), (1, 10), (32, 1), (32, 10)]);
    }

    #[test]
    fn a_redemption_run_takes_its_retries_and_measures_the_service_alone() {
        let cli = Cli::try_parse_from([
            "tokenmint-bench",
            "run",
            "--workload",
            "redeem",
            "-c",
            "32",
            "-q",
            "10",
            "--retries",
            "0.3",
            "--target",
            "all",
        ])
        .unwrap();
        let run = scenarios(&cli.command);
        assert_eq!(run.len(), 2);
        assert!(
            run.iter()
                .all(|s| s.service && !s.floor && !s.reference_floor)
        );
        assert_eq!(run[1].workload.operation, Operation::Redeem);
        assert_eq!(run[1].workload.replays, 0.3);
        assert_eq!(run[1].workload.quantity, 10);
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
