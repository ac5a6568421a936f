//! The embedded MongoDB: with no `mongo.uri`, `tokenmint serve` runs the pinned mongod
//! itself as a single-node replica set (so transactions work) on loopback, with its data
//! in `mongo.embedded.data_dir`, and stops it on shutdown.
//!
//! The port is chosen once and remembered in the data directory, because the replica-set
//! configuration stored in the data names `host:port`: a restart on another port would
//! come up as a member that is not in its own set, never primary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mongodb::Client;
use mongodb::bson::doc;
use mongodb::options::ClientOptions;
use tokio::process::{Child, Command};

use crate::settings::EmbeddedMongoSettings;

/// Where `scripts/install-mongod.sh` puts the pinned binary.
pub const INSTALLED_BINARY: &str = ".tools/mongodb/bin/mongod";
const REPLICA_SET: &str = "rs0";
const PORT_FILE: &str = "tokenmint-port";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

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
}

/// A running embedded mongod.
pub struct EmbeddedMongo {
    child: Child,
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
    /// primary. A second start on the same data directory reuses data and port.
    pub async fn start(settings: &EmbeddedMongoSettings) -> Result<Self, EmbeddedError> {
        let binary = find_binary(&settings.binary)?;
        let data_dir = &settings.data_dir;
        std::fs::create_dir_all(data_dir)?;
        let port = remembered_port(data_dir)?;
        let log = data_dir.join("mongod.log");
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
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        die_with_parent(command.as_std_mut(), libc::SIGTERM);
        let child = command.spawn()?;
        tracing::info!(binary = %binary.display(), port, data_dir = %data_dir.display(), "started embedded mongod");
        let mut mongo = Self {
            child,
            uri: format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
            log,
        };
        mongo.initiate(port).await?;
        Ok(mongo)
    }

    /// The mongod process id (for operators' tooling and fault-injection tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
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
            if let Some(status) = self.child.try_wait()? {
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

    /// Asks mongod to shut down cleanly and waits for it; kills it if it will not.
    pub async fn stop(mut self) {
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
        match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(_) => tracing::info!("embedded mongod stopped"),
            Err(_) => {
                tracing::warn!("embedded mongod did not stop in time; killing it");
                let _ = self.child.kill().await;
            }
        }
    }
}

/// The port recorded in `data_dir`, or a free one, recorded for next time.
fn remembered_port(data_dir: &Path) -> Result<u16, EmbeddedError> {
    let file = data_dir.join(PORT_FILE);
    if let Some(port) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|p| p.trim().parse().ok())
    {
        return Ok(port);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    std::fs::write(&file, port.to_string())?;
    Ok(port)
}

/// On Linux, the child started by `command` gets `signal` when the thread that started it
/// dies, so a killed parent never leaves an orphan behind (a mongod holding its data
/// directory, a service still bound to its port). Elsewhere this does nothing.
///
/// Shared by every place that starts a child process: the embedded mongod, and the
/// bench's and the fault-injection tests' service and mongod processes.
pub fn die_with_parent(command: &mut std::process::Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, signal);
}
