//! The command line: `tokenmint serve | migrate [--dry-run] | duplicates [--json] | verify
//! [--repair] [--json] | keys new|dev | openapi | healthcheck [--url URL] | webhooks sign`. Exit status, for every command: 0 done and
//! clean, 1 the command ran and found something (violations, duplicates), 2 it could not
//! run (bad configuration or usage, database unreachable, a failed start). `--json`
//! prints one JSON document instead of the text (the shapes are `report`'s), with the same
//! exit status.
//!
//! With the embedded database, the operator commands (migrate, duplicates, verify) use
//! the mongod a running `tokenmint serve` has on the same data directory, and leave it
//! running; with none running they start their own and stop it when done.

mod report;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use utoipa::OpenApi;

use crate::domain::{AccountGrant, Scope};
use crate::http::auth::{key_hash, random_key};
use crate::settings::Settings;
use crate::startup::{Application, connect, dev_key_path, read_dev_key, shutdown_signal};

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
    Duplicates {
        /// Print one JSON document instead of text (same exit status).
        #[arg(long)]
        json: bool,
    },
    /// Check the invariants (exactly tokenIndex 0..quantity-1 per payment, tokens matching
    /// their issuance, no duplicates or orphans, every token versioned, no stranded pending
    /// issuance, no active token of a refunded or canceled payment); exit 1 on violations.
    Verify {
        /// First fix what is safe to fix: complete short token sets, revoke the active
        /// tokens of refunded or canceled payments. Then check, and report the rest.
        #[arg(long)]
        repair: bool,
        /// Print one JSON document instead of text (same exit status).
        #[arg(long)]
        json: bool,
    },
    /// API keys: make a new one, or print the development key again.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Print the OpenAPI document (YAML).
    Openapi,
    /// Payment provider webhooks.
    Webhooks {
        #[command(subcommand)]
        command: WebhooksCommand,
    },
    /// Ask a running service whether it is ready (GET /readyz): exit 0 when it answers
    /// 200, 1 otherwise or when unreachable. For container health checks.
    Healthcheck {
        /// The URL to ask; default /readyz on server.bind (a wildcard bind on loopback).
        #[arg(long)]
        url: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Sign an event as the configured provider would, with its first secret, to try a
    /// set-up: prints the headers, one per line, for `curl -H @FILE`; for Adyen, the batch
    /// with every item's `hmacSignature` filled in, to send as the body.
    Sign {
        /// The configured provider's name (`[providers.NAME]`).
        #[arg(long)]
        provider: String,
        /// The event (for Adyen, the batch) as the provider would send it.
        #[arg(long)]
        file: PathBuf,
        /// Standard Webhooks: the message id (the event id); default a random one.
        #[arg(long)]
        id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a fresh random key (once: only its SHA-256 is configured) to stderr, and its
    /// `[[auth.keys]]` entry to stdout, e.g. `tokenmint keys new --id ci >> config.toml`.
    New {
        /// The key's id (logged with its requests); default `key-` and 8 random hex digits.
        #[arg(long)]
        id: Option<String>,
        /// Comma-separated scopes: issuances:write, issuances:request, read,
        /// tokens:redeem, tokens:revoke, tokens:transfer, admin. Default: admin.
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// Comma-separated accounts the key is limited to, each an accountId (at every
        /// provider) or `provider/accountId` (at that provider only); default: every account.
        #[arg(long, value_delimiter = ',')]
        accounts: Option<Vec<String>>,
    },
    /// Print the development admin key the embedded default keeps in its data directory.
    Dev,
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
    /// The settings the command runs with, loaded before the runtime (which they size);
    /// `None` for the commands that need none (`openapi`, `keys new`), which a broken
    /// configuration must not stop, or only `server.bind` (`healthcheck`).
    pub fn settings(&self) -> anyhow::Result<Option<Settings>> {
        match self.command {
            Command::Openapi
            | Command::Healthcheck { .. }
            | Command::Keys {
                command: KeysCommand::New { .. },
            } => Ok(None),
            _ => Ok(Some(Settings::load(self.config.as_deref())?)),
        }
    }

    /// Runs the command with the settings `Cli::settings` loaded; `Err` means it could not
    /// run (exit 2).
    pub async fn run(self, settings: Option<Settings>) -> anyhow::Result<Finished> {
        // Commands that need no configuration: a broken one must not stop them.
        match self.command {
            Command::Openapi => {
                let yaml = crate::http::ApiDoc::openapi()
                    .to_yaml()
                    .context("render OpenAPI")?;
                print!("{yaml}");
                return Ok(Finished::Clean);
            }
            Command::Keys {
                command:
                    KeysCommand::New {
                        id,
                        scopes,
                        accounts,
                    },
            } => return new_key(id, scopes, accounts),
            Command::Healthcheck { url } => {
                return healthcheck(self.config.as_deref(), url.as_deref()).await;
            }
            _ => {}
        }
        let settings = settings.context("the command's settings were not loaded")?;
        // A provider secret no delivery could verify stops every command, as any bad
        // setting does, though only `serve` and `webhooks sign` use the providers.
        crate::webhooks::Providers::from_settings(&settings.providers)?;
        let traces = crate::telemetry::init(&settings.log, &settings.telemetry)?;
        let finished = async {
            match self.command {
                Command::Serve => {
                    let app = Application::build(&settings).await?;
                    app.run_until_stopped(shutdown_signal()).await?;
                    Ok(Finished::Clean)
                }
                Command::Migrate { dry_run } => migrate(&settings, dry_run).await,
                Command::Duplicates { json } => duplicates(&settings, json).await,
                Command::Webhooks {
                    command: WebhooksCommand::Sign { provider, file, id },
                } => {
                    let body = std::fs::read(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    print!(
                        "{}",
                        sign_webhook(&settings, &provider, &body, id.as_deref())?
                    );
                    Ok(Finished::Clean)
                }
                Command::Verify { repair, json } => verify(&settings, repair, json).await,
                Command::Keys {
                    command: KeysCommand::Dev,
                } => dev_key(&settings),
                Command::Openapi
                | Command::Healthcheck { .. }
                | Command::Keys {
                    command: KeysCommand::New { .. },
                } => unreachable!("handled above"),
            }
        }
        .await;
        // The exporter's last batch: blocking, so off the runtime's threads.
        if let Some(traces) = traces {
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
        finished
    }
}

/// The runtime a command runs on: `server.worker_threads` workers when the settings
/// name a number, else one per core (or `TOKIO_WORKER_THREADS`), as for the commands
/// that load no settings.
pub fn runtime(settings: Option<&Settings>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = settings.and_then(|settings| settings.server.worker_threads) {
        builder.worker_threads(threads.get());
    }
    builder.build().context("cannot start the async runtime")
}

/// `keys new`: the key to stderr (so that stdout can be appended to a config file), the
/// entry to stdout.
fn new_key(
    id: Option<String>,
    scopes: Vec<String>,
    accounts: Option<Vec<String>>,
) -> anyhow::Result<Finished> {
    let id = id.unwrap_or_else(|| random_key("key-")[..12].to_owned());
    if id.trim().is_empty() {
        anyhow::bail!("--id must not be empty");
    }
    let scopes = if scopes.is_empty() {
        eprintln!(
            "no --scopes given: the key gets `admin` (every scope); pass --scopes to limit it"
        );
        vec![Scope::Admin.as_str().to_owned()]
    } else {
        let mut parsed: Vec<String> = Vec::new();
        for scope in &scopes {
            let scope: Scope = scope.trim().parse()?;
            if !parsed.iter().any(|known| known == scope.as_str()) {
                parsed.push(scope.as_str().to_owned());
            }
        }
        parsed
    };
    let accounts = match accounts {
        Some(accounts) => {
            let accounts: Vec<String> = accounts.iter().map(|a| a.trim().to_owned()).collect();
            if accounts.is_empty() {
                anyhow::bail!("--accounts must list at least one accountId");
            }
            for account in &accounts {
                if let Err(rule) = AccountGrant::parse(account) {
                    anyhow::bail!("--accounts: `{account}` {rule}");
                }
            }
            Some(accounts)
        }
        None => None,
    };
    let key = random_key("tm_");
    eprintln!(
        "New API key `{id}` (shown once: tokenmint keeps only its SHA-256; give it to the client now):\n\n    {key}\n\nIts entry for the configuration follows on stdout.\n"
    );
    let list = |items: &[String]| {
        items
            .iter()
            .map(|item| toml_string(item))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut entry = format!(
        "[[auth.keys]]\nid = {}\nsha256 = \"{}\"\nscopes = [{}]\n",
        toml_string(&id),
        key_hash(&key),
        list(&scopes)
    );
    if let Some(accounts) = &accounts {
        entry.push_str(&format!("accounts = [{}]\n", list(accounts)));
    }
    print!("{entry}");
    Ok(Finished::Clean)
}

/// `text` as a TOML basic string. JSON's string escapes are all valid TOML escapes.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// `keys dev`: the development key kept by the embedded default, on stdout.
fn dev_key(settings: &Settings) -> anyhow::Result<Finished> {
    settings.refuse_development_key()?;
    if !settings.auth.keys.is_empty() {
        anyhow::bail!("[[auth.keys]] is configured, so no development key is in use");
    }
    if settings.mongo.configured_uri().is_some() {
        anyhow::bail!(
            "mongo.uri is set: a development key is only kept with the embedded database (a start with mongo.uri and no [[auth.keys]] prints a key valid for that run)"
        );
    }
    let path = dev_key_path(settings);
    match read_dev_key(&path)? {
        Some(key) => {
            println!("{key}");
            Ok(Finished::Clean)
        }
        None => anyhow::bail!(
            "no development key in {} yet: the first `tokenmint serve` on the embedded database with no [[auth.keys]] creates it",
            path.display()
        ),
    }
}

/// `healthcheck`: prints what it found, so `docker inspect` shows why a check failed.
/// Of the configuration it reads `server.bind` alone, and only without `url`.
async fn healthcheck(
    config: Option<&std::path::Path>,
    url: Option<&str>,
) -> anyhow::Result<Finished> {
    let target = match url {
        Some(url) => crate::healthcheck::Target::parse(url)?,
        None => crate::healthcheck::Target::readyz_at(Settings::load_bind(config)?),
    };
    if crate::healthcheck::check(&target).await {
        println!("ready");
        Ok(Finished::Clean)
    } else {
        println!("not ready");
        Ok(Finished::Findings)
    }
}

/// `webhooks sign`: what it prints for `body` signed now by the provider configured as
/// `provider`.
pub fn sign_webhook(
    settings: &Settings,
    provider: &str,
    body: &[u8],
    id: Option<&str>,
) -> anyhow::Result<String> {
    let providers = crate::webhooks::Providers::from_settings(&settings.providers)?;
    let config = providers
        .get(provider)
        .with_context(|| format!("no provider `{provider}` is configured"))?;
    let id = id.map_or_else(|| random_key("msg_")[..24].to_owned(), str::to_owned);
    Ok(config.signed_text(body, &id, chrono::Utc::now().timestamp())?)
}

async fn migrate(settings: &Settings, dry_run: bool) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let days = settings.webhooks.retention_days;
    let result = async {
        let report = match crate::migrate::run(&store, dry_run).await {
            // Found, as `duplicates` finds them: the command ran, and this is its finding.
            Err(err @ crate::migrate::MigrateError::Duplicates { .. }) => {
                eprintln!("{err}");
                return anyhow::Ok(None);
            }
            report => report?,
        };
        // The TTL index of webhook_events follows a setting, not a file: kept in step here
        // as a start that applies migrations does.
        let kept = store.webhook_retention_days().await?;
        if !dry_run && kept != Some(u64::from(days)) {
            store.ensure_webhook_retention(days).await?;
        }
        anyhow::Ok(Some((report, kept)))
    }
    .await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let Some((report, kept)) = result? else {
        return Ok(Finished::Findings);
    };
    let verb = if dry_run { "would apply" } else { "applied" };
    for id in &report.already_applied {
        println!("already applied  {id}");
    }
    for index in &report.recreated {
        let verb = if dry_run { "would rebuild" } else { "rebuilt" };
        println!("{verb:<16} {index}");
    }
    for id in &report.applied {
        println!("{verb:<16} {id}");
    }
    if report.applied.is_empty() && report.recreated.is_empty() {
        println!("nothing to apply");
    }
    if kept != Some(u64::from(days)) {
        let verb = if dry_run { "would keep" } else { "now keeps" };
        println!("webhook_events   {verb} events {days} days (webhooks.retention_days)");
    }
    Ok(Finished::Clean)
}

async fn duplicates(settings: &Settings, json: bool) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let result = async {
        let mut reports = Vec::new();
        for index in crate::migrate::unique_indexes()? {
            reports.push(crate::migrate::find_duplicates(&store, &index).await?);
        }
        anyhow::Ok(reports)
    }
    .await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let reports = result?;
    let found: i64 = reports.iter().map(|r| r.total).sum();
    if json {
        println!("{}", report::duplicates(&reports));
    } else {
        for report in &reports {
            if report.groups.is_empty() {
                println!("{} on {}: no duplicates", report.index, report.collection);
            } else {
                println!("{report}");
            }
        }
        if found > 0 {
            println!("{found} group(s) of duplicates found");
        }
    }
    Ok(if found > 0 {
        Finished::Findings
    } else {
        Finished::Clean
    })
}

async fn verify(settings: &Settings, repair: bool, json: bool) -> anyhow::Result<Finished> {
    let (store, embedded) = connect(settings).await?;
    let result = async {
        let repaired = if repair {
            let report = crate::startup::issuer(settings, store.clone())
                .repair_all()
                .await?;
            if !json {
                println!(
                    "repaired: {} unfinished issuance(s) completed ({} re-opened), {} token(s) written, {} token(s) revoked, {} could not be repaired",
                    report.records_finished,
                    report.records_reopened,
                    report.tokens_created,
                    report.tokens_revoked,
                    report.failed
                );
            }
            Some(report)
        } else {
            None
        };
        let mut report = store.verify().await?;
        let missing = crate::migrate::missing_indexes(&store).await?;
        report.missing_indexes = crate::store::Finding {
            count: missing.len() as u64,
            samples: missing,
        };
        anyhow::Ok((repaired, report))
    }
    .await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    let (repaired, report) = result?;
    if json {
        println!("{}", report::verify(&report, repaired.as_ref()));
    } else {
        println!("{report}");
    }
    Ok(if report.is_clean() {
        Finished::Clean
    } else {
        Finished::Findings
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `server.worker_threads` sizes the runtime every command runs on.
    #[test]
    fn the_runtime_has_the_worker_threads_the_settings_name() {
        let workers = |layer: &str| {
            let settings = Settings::with_overrides(&[layer]).unwrap();
            runtime(Some(&settings)).unwrap().metrics().num_workers()
        };
        assert_eq!(workers(""), 1, "the default");
        assert_eq!(workers("[server]\nworker_threads = 3"), 3);
        let per_core = runtime(None).unwrap().metrics().num_workers();
        assert_eq!(workers("[server]\nworker_threads = 0"), per_core);
    }
}
