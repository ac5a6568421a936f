//! The `tokenmint` binary: parse the command line, load the settings its command needs,
//! build the runtime they size, and run it. Everything else is in the library, so tests
//! drive the same code. Exit status: 0 clean, 1 findings, 2 could not run.

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;

use clap::Parser;
use futures::FutureExt;
use tokenmint::cli::Finished;

fn main() -> ExitCode {
    // Usage errors exit 2 (clap's convention matches ours), --help and --version 0.
    let cli = tokenmint::cli::Cli::parse();
    // The settings come before the runtime: its worker threads are one of them.
    let run = cli.settings().and_then(|settings| {
        let runtime = tokenmint::cli::runtime(settings.as_ref())?;
        // Even a panic (a bug) ends with "could not run". Run here, on the main thread,
        // not on a spawned task: the embedded mongod is tied to the thread that starts it
        // (see `die_with_parent`), and the main thread lives as long as the process.
        Ok(runtime.block_on(AssertUnwindSafe(cli.run(settings)).catch_unwind()))
    });
    match run {
        Ok(Ok(Ok(Finished::Clean))) => ExitCode::SUCCESS,
        Ok(Ok(Ok(Finished::Findings))) => ExitCode::from(1),
        Ok(Ok(Err(err))) | Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
        Ok(Err(_)) => {
            eprintln!("error: tokenmint panicked (see the message above)");
            ExitCode::from(2)
        }
    }
}
