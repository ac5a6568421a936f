//! The `tokenmint` binary: parse the command line and run it. Everything else is in the
//! library, so tests drive the same code. Exit status: 0 clean, 1 findings, 2 could not run.

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;

use clap::Parser;
use futures::FutureExt;
use tokenmint::cli::Finished;

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors exit 2 (clap's convention matches ours), --help and --version 0.
    let cli = tokenmint::cli::Cli::parse();
    // Even a panic (a bug) ends with "could not run". Run here, not on a spawned task:
    // the embedded mongod is tied to the thread that starts it (see `die_with_parent`),
    // and the main thread lives as long as the process.
    match AssertUnwindSafe(cli.run()).catch_unwind().await {
        Ok(Ok(Finished::Clean)) => ExitCode::SUCCESS,
        Ok(Ok(Finished::Findings)) => ExitCode::from(1),
        Ok(Err(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!("error: tokenmint panicked (see the message above)");
            ExitCode::from(2)
        }
    }
}
