//! The command line: `tokenmint serve | migrate [--dry-run] | duplicates | openapi`.

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
    /// Check the issuance invariants (exactly tokenIndex 0..quantity-1 per payment, no
    /// duplicates or orphans, every token versioned, no stranded pending issuance); exits
    /// non-zero on any violation.
    Verify,
    /// Print the OpenAPI document (YAML).
    Openapi,
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<()> {
        if let Command::Openapi = self.command {
            let yaml = crate::http::ApiDoc::openapi()
                .to_yaml()
                .context("render OpenAPI")?;
            print!("{yaml}");
            return Ok(());
        }
        let settings = Settings::load(self.config.as_deref())?;
        crate::telemetry::init_logging(&settings.log);
        match self.command {
            Command::Serve => {
                let app = Application::build(&settings).await?;
                app.run_until_stopped(shutdown_signal()).await
            }
            Command::Migrate { dry_run } => migrate(&settings, dry_run).await,
            Command::Duplicates => duplicates(&settings).await,
            Command::Verify => verify(&settings).await,
            Command::Openapi => unreachable!("handled above"),
        }
    }
}

async fn migrate(settings: &Settings, dry_run: bool) -> anyhow::Result<()> {
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
    Ok(())
}

async fn duplicates(settings: &Settings) -> anyhow::Result<()> {
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
        anyhow::bail!("{found} group(s) of duplicates found");
    }
    Ok(())
}

async fn verify(settings: &Settings) -> anyhow::Result<()> {
    let (store, embedded) = connect(settings).await?;
    let result = store.verify().await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let report = result?;
    println!("{report}");
    if !report.is_clean() {
        anyhow::bail!("{} invariant violation(s)", report.violations());
    }
    Ok(())
}
