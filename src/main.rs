//! The `tokenmint` binary: parse the command line and run it. Everything else is in the
//! library, so tests drive the same code. Exit status: 0 clean, 1 findings, 2 could not run.

use std::process::ExitCode;

use clap::Parser;
use tokenmint::cli::Finished;

#[tokio::main]
async fn main() -> ExitCode {
    match tokenmint::cli::Cli::parse().run().await {
        Ok(Finished::Clean) => ExitCode::SUCCESS,
        Ok(Finished::Findings) => ExitCode::from(1),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
