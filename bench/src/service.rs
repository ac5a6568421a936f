//! The processes under test: the pinned mongod (started through tokenmint's own
//! `EmbeddedMongo`, so with exactly the service's arguments) and the release tokenmint
//! binary, one fresh process and database per scenario; and the service's settings, which
//! its in-process store and the floors connect with.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use mongodb::bson::oid::ObjectId;
use tokenmint::embedded::{EmbeddedMongo, die_with_parent};
use tokenmint::issuing::Issuer;
use tokenmint::settings::{EmbeddedMongoSettings, Settings};
use tokenmint::store::Store;
use tokio::process::{Child, Command};

use crate::procfs;

/// The MongoDB the run uses.
pub struct Mongo {
    uri: String,
    pid: Option<u32>,
    embedded: Option<(EmbeddedMongo, std::path::PathBuf)>,
    /// The bench's own connection, for `serverStatus` and dropping databases.
    admin: mongodb::Client,
}

/// mongod's `opcounters`: insert, query, update, delete, getmore, command.
pub type OpCounters = [i64; 6];
pub const OPCOUNTER_NAMES: [&str; 6] =
    ["insert", "query", "update", "delete", "getmore", "command"];

impl Mongo {
    pub async fn external(uri: &str, pid: Option<u32>) -> anyhow::Result<Self> {
        Ok(Self {
            uri: uri.to_owned(),
            pid,
            embedded: None,
            admin: mongodb::Client::with_uri_str(uri).await?,
        })
    }

    /// Starts the pinned mongod as a single-node replica set in a fresh `data_dir`.
    pub async fn start(binary: &str, data_dir: &Path) -> anyhow::Result<Self> {
        if data_dir.exists() {
            std::fs::remove_dir_all(data_dir)
                .with_context(|| format!("cannot empty {}", data_dir.display()))?;
        }
        let settings = EmbeddedMongoSettings {
            binary: binary.to_owned(),
            data_dir: data_dir.to_path_buf(),
        };
        let embedded = EmbeddedMongo::start(&settings).await?;
        let pid = procfs::find_mongod_by_dbpath(data_dir);
        if pid.is_none() {
            eprintln!(
                "warning: cannot find the mongod of {} in /proc; no mongod CPU figures",
                data_dir.display()
            );
        }
        Ok(Self {
            uri: embedded.uri().to_owned(),
            pid,
            admin: mongodb::Client::with_uri_str(embedded.uri()).await?,
            embedded: Some((embedded, data_dir.to_path_buf())),
        })
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Drops the scenario's databases so that the next scenario starts from the same state.
    pub async fn drop_databases(&self, names: &[&str]) {
        for name in names {
            if let Err(err) = self.admin.database(name).drop().await {
                eprintln!("warning: cannot drop database {name}: {err}");
            }
        }
    }

    /// The server's operation counters (every database, every client).
    pub async fn opcounters(&self) -> Option<OpCounters> {
        let status = self
            .admin
            .database("admin")
            .run_command(mongodb::bson::doc! { "serverStatus": 1, "opcounters": 1 })
            .await
            .ok()?;
        let counters = status.get_document("opcounters").ok()?;
        let mut out = [0; 6];
        for (slot, name) in out.iter_mut().zip(OPCOUNTER_NAMES) {
            *slot = match counters.get(name)? {
                mongodb::bson::Bson::Int32(v) => i64::from(*v),
                mongodb::bson::Bson::Int64(v) => *v,
                mongodb::bson::Bson::Double(v) => *v as i64,
                _ => return None,
            };
        }
        Some(out)
    }

    pub async fn stop(self, keep_data: bool) {
        self.admin.shutdown().await;
        if let Some((embedded, data_dir)) = self.embedded {
            embedded.stop().await;
            if !keep_data {
                let _ = std::fs::remove_dir_all(data_dir);
            }
        }
    }
}

/// A running tokenmint.
pub struct Service {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    api_key: String,
}

impl Service {
    /// Starts `binary serve` on a free loopback port against `database`, with an admin key
    /// and a rate limit that never throttles, and waits for `/readyz`.
    pub async fn start(
        binary: &Path,
        mongo_uri: &str,
        database: &str,
        max_pool_size: u32,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let addr = free_port()?;
        let api_key = format!("tm_bench_{}", ObjectId::new().to_hex());
        // figment parses inline tables in environment values.
        let keys = format!(
            r#"[{{id="bench", sha256="{}", scopes=["admin"]}}]"#,
            tokenmint::http::auth::key_hash(&api_key)
        );
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .env("TOKENMINT__MONGO__URI", mongo_uri)
            .env("TOKENMINT__MONGO__DATABASE", database)
            .env("TOKENMINT__MONGO__MAX_POOL_SIZE", max_pool_size.to_string())
            .env("TOKENMINT__SERVER__BIND", addr.to_string())
            .env("TOKENMINT__LOG__LEVEL", "warn")
            .env("TOKENMINT__AUTH__KEYS", keys)
            .env("TOKENMINT__RATE_LIMIT__PER_KEY_PER_SECOND", "1000000000")
            .env("TOKENMINT__RATE_LIMIT__BURST", "1000000000")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true);
        // SIGTERM if the bench dies: no stray tokenmint keeps running.
        die_with_parent(command.as_std_mut(), libc::SIGTERM);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("tokenmint exited at once")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                anyhow::bail!("tokenmint exited during startup ({status}):\n{text}");
            }
            if let Ok(200) = crate::http::get_status(addr, "/readyz").await {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("tokenmint was not ready within 60 s; see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Self {
            child,
            pid,
            addr,
            api_key,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time.
    pub async fn stop(mut self) {
        // SAFETY: kill(2) on our own child's PID; it has not been reaped yet.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("warning: tokenmint did not stop within 15 s; killing it");
            let _ = self.child.kill().await;
        }
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The service's settings as it starts with no configuration (the compiled-in defaults),
/// on `database` at `uri` with `max_pool_size` connections. The in-process store and the
/// floors connect with them, so timeouts and retry bounds are defined once.
pub fn service_settings(uri: &str, database: &str, max_pool_size: u32) -> anyhow::Result<Settings> {
    Ok(Settings::with_overrides(&[&format!(
        "[mongo]\nuri = \"{uri}\"\ndatabase = \"{database}\"\nmax_pool_size = {max_pool_size}\n"
    )])?)
}

/// tokenmint's store on `settings`' database, connected as the service connects and with
/// tokenmint's migrations applied, so its indexes are the service's own.
pub async fn migrated_store(settings: &Settings) -> anyhow::Result<Store> {
    let (store, _) = tokenmint::startup::connect(settings).await?;
    tokenmint::migrate::run(&store, false).await?;
    Ok(store)
}

/// tokenmint's own issuing service on `database`, connected, migrated and configured as
/// the service does it with its default settings.
pub async fn connect_store(
    uri: &str,
    database: &str,
    max_pool_size: u32,
) -> anyhow::Result<Issuer> {
    let settings = service_settings(uri, database, max_pool_size)?;
    let store = migrated_store(&settings).await?;
    Ok(tokenmint::startup::issuer(&settings, store))
}
