//! tokenmint-bench: drives `POST /v1/issuances` closed-loop with N concurrent clients and,
//! in the same run, two database floors issued directly with the mongodb crate (the
//! per-request floor: tokenmint's design before group commit; the reference floor: one
//! unordered bulk of `$setOnInsert` upserts per issuance), then reports throughput,
//! latency, statuses, CPU per issuance of the service and of mongod, and tokenmint ÷ each
//! floor. With `--workload redeem` it measures `POST /v1/redemptions` instead, each
//! redemption scenario beside an issuance scenario of the same shape. See
//! docs/BENCHMARKS.md; `scripts/bench.sh` is the one command.
//!
//! This file is the run as a whole: the runtime, mongod for the run, the scenarios in
//! order, and the report at the end. One scenario is `scenario`, one measured segment
//! `segment`, the command line `cli`.

mod cli;
mod floor;
mod http;
mod op_times;
mod procfs;
mod report;
mod scenario;
mod segment;
mod service;
mod workload;

use std::path::Path;

use anyhow::Context;
use clap::Parser;

use crate::cli::{Cli, EnvArgs, Scenario, scenarios};
use crate::report::ScenarioResult;
use crate::scenario::run_scenario;
use crate::service::Mongo;

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
