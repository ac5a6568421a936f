//! The embedded MongoDB: with no `mongo.uri`, `tokenmint serve` runs the pinned mongod
//! itself as a single-node replica set (so transactions work) on loopback, with its data
//! in `mongo.embedded.data_dir`, and stops it on shutdown.
//!
//! The port is chosen once and remembered in the data directory, because the replica-set
//! configuration stored in the data names `host:port`: a restart on another port would
//! come up as a member that is not in its own set, never primary.
//!
//! One mongod per data directory: `start` refuses when a live mongod already holds it
//! (its pid is in `mongod.lock`), and operator commands (`attach_or_start`) use that
//! mongod instead, after checking that the server on the remembered port is that very
//! process, and never stop a mongod they did not start. mongod's stdout and stderr (what
//! it prints before its log is open) go to its log file too. mongod runs in its own
//! process group, so a terminal's Ctrl-C stops tokenmint first, never mongod under it.
//!
//! What the data directory records (the port, the live mongod's pid) is `data_dir`'s;
//! signalling child processes is `process`'s.

mod data_dir;
mod process;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mongodb::Client;
use mongodb::bson::doc;
use mongodb::options::ClientOptions;
use tokio::process::{Child, Command};

use crate::settings::EmbeddedMongoSettings;
pub use data_dir::running_mongod;
use data_dir::{PORT_FILE, process_alive, read_port, remembered_port};
pub use process::die_with_parent;
use process::{not_ours, server_pid, terminate};

/// Where `scripts/install-mongod.sh` puts the pinned binary.
pub const INSTALLED_BINARY: &str = ".tools/mongodb/bin/mongod";
const REPLICA_SET: &str = "rs0";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long mongod gets to finish after the `shutdown` command, then after SIGTERM.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no mongod binary found (looked for mongo.embedded.binary, {INSTALLED_BINARY}, and mongod on PATH).\n\
         Install the pinned MongoDB with:  scripts/install-mongod.sh\n\
         or set mongo.uri (TOKENMINT__MONGO__URI) to an existing replica set."
    )]
    BinaryNotFound,
    #[error("configured mongo.embedded.binary {0} does not exist")]
    ConfiguredBinaryMissing(PathBuf),
    #[error("embedded mongod: {0}")]
    Io(#[from] std::io::Error),
    #[error("embedded mongod exited during startup ({status}); see {log}")]
    Exited { status: String, log: PathBuf },
    #[error("embedded mongod did not become a writable primary within {0:?}; see {1}")]
    NotReady(Duration, PathBuf),
    #[error("embedded mongod: {0}")]
    Mongo(#[from] mongodb::error::Error),
    #[error(
        "an embedded mongod (pid {pid}) already runs on {data_dir}: another `tokenmint serve` \
         (or an operator command) is using it. Stop that one first, or use another \
         mongo.embedded.data_dir"
    )]
    InUse { pid: u32, data_dir: PathBuf },
    #[error(
        "the embedded mongod (pid {pid}) on {data_dir} has no remembered port ({file} is missing or damaged)"
    )]
    NoPort {
        pid: u32,
        data_dir: PathBuf,
        file: PathBuf,
    },
    #[error(
        "port {port} remembered in {data_dir} is answered by {found}, not by the mongod \
         holding the data directory (pid {pid}); not using it"
    )]
    NotOurs {
        port: u16,
        pid: u32,
        data_dir: PathBuf,
        found: String,
    },
    #[error(
        "the embedded mongod (pid {pid}) on {data_dir} did not answer as a writable primary \
         on port {port} within {timeout:?}; see {log}"
    )]
    Unresponsive {
        pid: u32,
        port: u16,
        data_dir: PathBuf,
        timeout: Duration,
        log: PathBuf,
    },
}

/// An embedded mongod in use: one this process started (and stops), or one another
/// tokenmint process started on the same data directory, which this one only uses.
pub struct EmbeddedMongo {
    /// `None` when attached to another process's mongod.
    child: Option<Child>,
    pid: Option<u32>,
    uri: String,
    log: PathBuf,
}

/// The mongod to run: the configured path, else the installed pinned one, else PATH.
pub fn find_binary(configured: &str) -> Result<PathBuf, EmbeddedError> {
    if !configured.is_empty() {
        let path = PathBuf::from(configured);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EmbeddedError::ConfiguredBinaryMissing(path))
        };
    }
    let installed = PathBuf::from(INSTALLED_BINARY);
    if installed.is_file() {
        return Ok(installed);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("mongod"))
        .find(|candidate| candidate.is_file())
        .ok_or(EmbeddedError::BinaryNotFound)
}

impl EmbeddedMongo {
    /// Starts mongod, initiates the replica set on first use and waits for a writable
    /// primary. A second start on the same data directory reuses data and port. Refuses
    /// (`InUse`) when a mongod already runs on the data directory.
    pub async fn start(settings: &EmbeddedMongoSettings) -> Result<Self, EmbeddedError> {
        Self::start_with_parameters(settings, &[]).await
    }

    /// `start`, with each of `parameters` passed as `--setParameter NAME=VALUE`: the test
    /// harness enables `enableTestCommands=1` on its mongod, so that tests can make one
    /// command fail or hang (`configureFailPoint`). Never needed by the service itself.
    pub async fn start_with_parameters(
        settings: &EmbeddedMongoSettings,
        parameters: &[&str],
    ) -> Result<Self, EmbeddedError> {
        let binary = find_binary(&settings.binary)?;
        let data_dir = &settings.data_dir;
        std::fs::create_dir_all(data_dir)?;
        if let Some(pid) = running_mongod(data_dir) {
            return Err(EmbeddedError::InUse {
                pid,
                data_dir: data_dir.clone(),
            });
        }
        let port = remembered_port(data_dir)?;
        let log = data_dir.join("mongod.log");
        // What mongod prints before its log is open (bad options, a locked data
        // directory) would otherwise be lost.
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut command = Command::new(&binary);
        command
            .arg("--dbpath")
            .arg(data_dir)
            .arg("--port")
            .arg(port.to_string())
            .args([
                "--bind_ip",
                "127.0.0.1",
                "--replSet",
                REPLICA_SET,
                "--logappend",
            ])
            .arg("--logpath")
            .arg(&log)
            .args(["--setParameter", "diagnosticDataCollectionEnabled=false"])
            // No snapshot history beyond what open reads hold. tokenmint never reads at a
            // past cluster time, and MongoDB's default keeps five minutes of it: every
            // index key a redemption deletes (its tokens leave the spending index's
            // `active` range) then stays, as a tombstone, where that owner's next scan
            // starts, and the scans slow down the longer an owner spends.
            .args(["--setParameter", "minSnapshotHistoryWindowInSeconds=0"])
            .args(parameters.iter().flat_map(|p| ["--setParameter", p]))
            // A development database: journal files of 20 MB made as needed, instead of
            // three of 100 MB made in advance (300 MB per data directory, per test binary).
            .args([
                "--wiredTigerEngineConfigString",
                "log=(prealloc=false,file_max=20MB)",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::from(output.try_clone()?))
            .stderr(Stdio::from(output));
        // Not kill_on_drop: a dropped handle asks mongod to stop (SIGTERM, see Drop), it
        // never kills it.
        die_with_parent(command.as_std_mut(), rustix::process::Signal::TERM.as_raw());
        // Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group)
        // reaches tokenmint only, which drains its in-flight requests (they still need
        // the database) and only then stops mongod.
        #[cfg(unix)]
        command.process_group(0);
        let child = command.spawn()?;
        let pid = child.id();
        tracing::info!(binary = %binary.display(), port, pid, data_dir = %data_dir.display(), "started embedded mongod");
        let mut mongo = Self {
            child: Some(child),
            pid,
            uri: uri(port),
            log,
        };
        if let Err(err) = mongo.initiate(port).await {
            // A mongod that came up but never became primary is stopped cleanly.
            mongo.stop().await;
            return Err(err);
        }
        Ok(mongo)
    }

    /// For operator commands: the mongod already running on the data directory (checked
    /// to be the process holding it, and left running afterwards), else one started here
    /// as by `start` (and stopped by `stop`).
    pub async fn attach_or_start(settings: &EmbeddedMongoSettings) -> Result<Self, EmbeddedError> {
        match running_mongod(&settings.data_dir) {
            Some(pid) => Self::attach(&settings.data_dir, pid).await,
            None => Self::start(settings).await,
        }
    }

    /// Uses the running mongod `pid` of `data_dir`, once the server on the remembered port
    /// proves to be that process and a writable primary.
    async fn attach(data_dir: &Path, pid: u32) -> Result<Self, EmbeddedError> {
        let file = data_dir.join(PORT_FILE);
        let port = read_port(&file).ok_or_else(|| EmbeddedError::NoPort {
            pid,
            data_dir: data_dir.to_path_buf(),
            file: file.clone(),
        })?;
        let log = data_dir.join("mongod.log");
        let uri = uri(port);
        let mut options = ClientOptions::parse(&uri).await?;
        options.server_selection_timeout = Some(Duration::from_millis(500));
        let client = Client::with_options(options)?;
        let admin = client.database("admin");
        let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(answering) = server_pid(&admin).await {
                if answering != Some(i64::from(pid)) {
                    return Err(not_ours(port, pid, data_dir, answering));
                }
                let primary = admin
                    .run_command(doc! { "hello": 1 })
                    .await
                    .is_ok_and(|hello| hello.get_bool("isWritablePrimary").unwrap_or(false));
                if primary {
                    tracing::info!(pid, port, data_dir = %data_dir.display(), "using the embedded mongod already running");
                    return Ok(Self {
                        child: None,
                        pid: Some(pid),
                        uri,
                        log,
                    });
                }
            }
            if tokio::time::Instant::now() > deadline || !process_alive(pid) {
                return Err(EmbeddedError::Unresponsive {
                    pid,
                    port,
                    data_dir: data_dir.to_path_buf(),
                    timeout: STARTUP_TIMEOUT,
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The mongod process id (for operators' tooling and fault-injection tests).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The URI to connect to it.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    async fn initiate(&mut self, port: u16) -> Result<(), EmbeddedError> {
        let mut options = ClientOptions::parse(&self.uri).await?;
        options.server_selection_timeout = Some(Duration::from_millis(500));
        let client = Client::with_options(options)?;
        let admin = client.database("admin");
        let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
        let mut initiated = false;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .map(Child::try_wait)
                .transpose()?
                .flatten()
            {
                return Err(EmbeddedError::Exited {
                    status: status.to_string(),
                    log: self.log.clone(),
                });
            }
            if tokio::time::Instant::now() > deadline {
                return Err(EmbeddedError::NotReady(STARTUP_TIMEOUT, self.log.clone()));
            }
            if let Ok(hello) = admin.run_command(doc! { "hello": 1 }).await {
                if hello.get_bool("isWritablePrimary").unwrap_or(false) {
                    // The port was free when it was chosen, but another mongod starting
                    // at the same moment may have taken it: the primary must be ours.
                    let ours = self.pid.unwrap_or_default();
                    let answering = server_pid(&admin).await?;
                    if answering != Some(i64::from(ours)) {
                        let data_dir = self.log.parent().unwrap_or(Path::new("."));
                        return Err(not_ours(port, ours, data_dir, answering));
                    }
                    return Ok(());
                }
                if !initiated && hello.get_str("setName").is_err() {
                    let config = doc! {
                        "_id": REPLICA_SET,
                        "members": [ { "_id": 0, "host": format!("127.0.0.1:{port}") } ],
                    };
                    // Code 23 (AlreadyInitialized) after a restart is fine.
                    match admin.run_command(doc! { "replSetInitiate": config }).await {
                        Ok(_) => initiated = true,
                        Err(e) if matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 23) => {
                            initiated = true
                        }
                        Err(e) => tracing::debug!(error = %e, "replSetInitiate not yet possible"),
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asks mongod to shut down cleanly (the `shutdown` command, then SIGTERM if it does
    /// not exit in time) and waits for it; never kills it. A mongod another process
    /// started is left running.
    pub async fn stop(mut self) {
        let Some(mut child) = self.child.take() else {
            tracing::info!(
                pid = self.pid,
                "left the embedded mongod running: another tokenmint process started it"
            );
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            tracing::warn!(
                "embedded mongod had already exited; see {}",
                self.log.display()
            );
            return;
        }
        if let Ok(mut options) = ClientOptions::parse(&self.uri).await {
            options.server_selection_timeout = Some(Duration::from_secs(2));
            if let Ok(client) = Client::with_options(options) {
                // The connection drops as the server exits, so an error here is expected.
                let _ = client
                    .database("admin")
                    .run_command(doc! { "shutdown": 1, "timeoutSecs": 5 })
                    .await;
            }
        }
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, child.wait())
            .await
            .is_ok()
        {
            tracing::info!("embedded mongod stopped");
            return;
        }
        tracing::warn!(
            "embedded mongod did not stop within {SHUTDOWN_TIMEOUT:?} of the shutdown command; sending SIGTERM"
        );
        terminate(&child);
        match tokio::time::timeout(TERMINATE_TIMEOUT, child.wait()).await {
            Ok(_) => tracing::info!("embedded mongod stopped"),
            Err(_) => tracing::error!(
                "embedded mongod is still shutting down after SIGTERM; left to finish (see {})",
                self.log.display()
            ),
        }
    }
}

impl Drop for EmbeddedMongo {
    /// A handle dropped without `stop` (an early error, a panic) still asks the mongod it
    /// started to shut down cleanly, without waiting.
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            terminate(child);
        }
    }
}

fn uri(port: u16) -> String {
    format!("mongodb://127.0.0.1:{port}/?directConnection=true")
}
