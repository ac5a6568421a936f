//! The command line: `tokenmint serve | migrate [--dry-run] | duplicates | verify
//! [--repair] | openapi`. Exit status, for every command: 0 done and clean, 1 the command
//! ran and found something (violations, duplicates), 2 it could not run (bad
//! configuration, database unreachable, a failed start).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use utoipa::OpenApi;

use crate::settings::Settings;
use crate::startup::{Application, connect, shutdown_signal};

#[derive(Debug, Parser)]
#[command(
    name = "tokenmint",
    version,
    about = "Issues tokens for payments, exactly once per payment."
)]
pub struct Cli {
    /// A TOML file layered over the defaults.
    #[arg(long, global = true, env = "TOKENMINT_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (starts the embedded mongod when mongo.uri is empty).
    Serve,
    /// Apply pending migrations.
    Migrate {
        /// Only list what would be applied.
        #[arg(long)]
        dry_run: bool,
    },
    /// List documents that violate (or would violate) tokenmint's unique indexes.
    Duplicates,
    /// Check the invariants (exactly tokenIndex 0..quantity-1 per payment, tokens matching
    /// their issuance, no duplicates or orphans, every token versioned, no stranded pending
    /// issuance, no active token of a refunded or canceled payment); exit 1 on violations.
    Verify {
        /// First fix what is safe to fix: complete short token sets, revoke the active
        /// tokens of refunded or canceled payments. Then check, and report the rest.
        #[arg(long)]
        repair: bool,
    },
    /// Print the OpenAPI document (YAML).
    Openapi,
}

/// How a command that ran ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Done, nothing to report: exit 0.
    Clean,
    /// Done, and it found violations or duplicates: exit 1.
    Findings,
}

impl Cli {
    /// Runs the command; `Err` means it could not run (exit 2).
    pub async fn run(self) -> anyhow::Result<Finished> {
        if let Command::Openapi = self.command {
            let yaml = crate::http::ApiDoc::openapi()
                .to_yaml()
                .context("render OpenAPI")?;
            print!("{yaml}");
            return Ok(Finished::Clean);
        }
        let settings = Settings::load(self.config.as_deref())?;
        crate::telemetry::init_logging(&settings.log);
        match self.command {
            Command::Serve => {
                let app = Application::build(&settings).await?;
                app.run_until_stopped(shutdown_signal()).await?;
                Ok(Finished::Clean)
            }
            Command::Migrate { dry_run } => migrate(&settings, dry_run).await,
            Command::Duplicates => duplicates(&settings).await,
            Command::Verify { repair } => verify(&settings, repair).await,
            Command::Openapi => unreachable!("handled above"),
        }
    }
}

async fn migrate(settings: &Settings, dry_run: bool) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let result = crate::migrate::run(&store, dry_run).await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let report = result?;
    let verb = if dry_run { "would apply" } else { "applied" };
    for id in &report.already_applied {
        println!("already applied  {id}");
    }
    for id in &report.applied {
        println!("{verb:<16} {id}");
    }
    if report.applied.is_empty() {
        println!("nothing to apply");
    }
    Ok(Finished::Clean)
}

async fn duplicates(settings: &Settings) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let mut found = 0;
    let mut result: anyhow::Result<()> = Ok(());
    for index in crate::migrate::unique_indexes()? {
        match crate::migrate::find_duplicates(&store, &index).await {
            Ok(report) if report.groups.is_empty() => {
                println!("{} on {}: no duplicates", index.name, index.collection)
            }
            Ok(report) => {
                found += report.groups.len();
                println!("{report}");
            }
            Err(err) => {
                result = Err(err.into());
                break;
            }
        }
    }
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    result?;
    if found > 0 {
        println!("{found} group(s) of duplicates found");
        return Ok(Finished::Findings);
    }
    Ok(Finished::Clean)
}

async fn verify(settings: &Settings, repair: bool) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let result = async {
        if repair {
            let report = crate::startup::issuer(settings, store.clone())
                .repair_all()
                .await?;
            println!(
                "repaired: {} unfinished issuance(s) completed ({} re-opened), {} token(s) written, {} token(s) revoked, {} could not be repaired",
                report.records_finished,
                report.records_reopened,
                report.tokens_created,
                report.tokens_revoked,
                report.failed
            );
        }
        store.verify().await
    }
    .await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let report = result?;
    println!("{report}");
    Ok(if report.is_clean() {
        Finished::Clean
    } else {
        Finished::Findings
    })
}
