//! The real `tokenmint` binary as a child process on the test mongod, for the suites that
//! SIGKILL it (crash) or watch its memory (soak), and one-shot commands run to their end.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokenmint::embedded::die_with_parent;
use tokenmint::http::auth::key_hash;

use crate::failpoint::mongo_uri_named;
use crate::mongod::{mongo_uri, workspace_root};

/// The admin key a [`Service`] accepts.
pub const SERVICE_KEY: &str = "service-test-key";

/// How many of the last stderr lines a [`Service`] keeps for failure messages.
const LOG_LINES: usize = 40;

/// The `tokenmint` binary cargo built for this test run, beside the test binary's
/// `deps/` folder. (A library has no `CARGO_BIN_EXE_tokenmint`: cargo sets it for
/// integration tests only, and builds the binary for them.)
pub fn tokenmint_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary under <target>/<profile>/deps")
        .join("tokenmint");
    assert!(binary.is_file(), "{} is not built", binary.display());
    binary
}

/// A running `tokenmint serve`; SIGKILLed and reaped on drop, so a failing test never
/// leaves one behind.
pub struct Service {
    child: Child,
    /// `http://host:port`.
    pub base: String,
    /// The last lines of its stderr, for failure messages.
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Service {
    /// Starts the binary against `database` and waits for its "listening on" line.
    pub fn start(database: &str) -> Service {
        Service::start_with(database, &[])
    }

    /// `start_with`, its MongoDB client named `app_name` (`mongo_uri_named`): what a
    /// `failCommand` failpoint aimed at this process's commands alone needs.
    pub fn start_named(database: &str, app_name: &str, settings: &[(&str, &str)]) -> Service {
        let uri = mongo_uri_named(app_name);
        let mut named = vec![("TOKENMINT__MONGO__URI", uri.as_str())];
        named.extend_from_slice(settings);
        Service::start_with(database, &named)
    }

    /// `start`, with `settings` as extra environment variables (after the defaults, so
    /// they may replace them: `RUST_LOG`, say). None of the caller's `TOKENMINT*`
    /// variables reach the child.
    pub fn start_with(database: &str, settings: &[(&str, &str)]) -> Service {
        let keys = format!(
            "[{{id=\"service\", sha256=\"{}\", scopes=[\"admin\"]}}]",
            key_hash(SERVICE_KEY)
        );
        let mut command = Command::new(tokenmint_binary());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TOKENMINT") {
                command.env_remove(name);
            }
        }
        command
            .arg("serve")
            .current_dir(workspace_root())
            .env("TOKENMINT__MONGO__URI", mongo_uri())
            .env("TOKENMINT__MONGO__DATABASE", database)
            .env("TOKENMINT__SERVER__BIND", "127.0.0.1:0")
            .env("TOKENMINT__AUTH__KEYS", keys)
            .env("TOKENMINT__RATE_LIMIT__PER_KEY_PER_SECOND", "100000")
            .env("TOKENMINT__RATE_LIMIT__BURST", "100000")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(settings.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SIGKILL if the test process dies first.
        die_with_parent(&mut command, libc::SIGKILL);
        let mut child = command.spawn().expect("tokenmint binary starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            // Drains stderr for the child's whole life (a full pipe would block it).
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find("listening on http://")
                        && let Some(tx) = tx.take()
                    {
                        let address = line[at + "listening on http://".len()..].trim();
                        let _ = tx.send(address.to_owned());
                    }
                    let mut log = log.lock().unwrap();
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let mut service = Service {
            child,
            base: String::new(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => service.base = format!("http://{address}"),
            Err(_) => panic!(
                "tokenmint did not report its address within 60 s:\n{}",
                service.recent_log()
            ),
        }
        service
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no graceful shutdown, in-flight requests die mid-way.
    pub fn kill(&mut self) {
        let pid = libc::pid_t::try_from(self.pid()).expect("a pid");
        // SAFETY: signalling a child process we started and have not reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill({pid}, SIGKILL)");
        self.child.wait().expect("reap the killed tokenmint");
    }

    /// The last lines of its stderr.
    pub fn recent_log(&self) -> String {
        let log = self.log.lock().unwrap();
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs one `tokenmint` command (`args`, such as `["verify", "--repair"]`) to its end on
/// `database` of the deployment at `uri`, with the extra environment `env`: its exit
/// status and output. Killed, failing the test, when it takes more than a minute.
pub async fn run_command(
    uri: &str,
    database: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut command = tokio::process::Command::new(tokenmint_binary());
    command
        .args(args)
        .env("TOKENMINT__MONGO__URI", uri)
        .env("TOKENMINT__MONGO__DATABASE", database)
        .env("NO_COLOR", "1")
        // The developer's own configuration must not leak into the command.
        .env_remove("TOKENMINT_CONFIG")
        .env_remove("TOKENMINT_ENV")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("tokenmint {args:?} did not finish within 60 s"))
        .expect("the tokenmint binary runs")
}
