//! The embedded mode end to end, with the real binary: `tokenmint serve` with no
//! `mongo.uri` starts its own mongod on a data directory, serves, stops it on SIGTERM,
//! and a second start on the same directory finds the data again.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokenmint::http::auth::key_hash;

const KEY: &str = "embedded-test-admin-key";
const MONGOD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/mongodb/bin/mongod");

/// A running `tokenmint serve`; killed (with its mongod, via the parent-death signal) if
/// the test fails before it stopped.
struct Server {
    child: Child,
    address: String,
    /// Every stderr line so far (colour codes removed), for failure messages.
    log: Arc<Mutex<Vec<String>>>,
    /// The raw stderr lines that carried ANSI escape codes.
    coloured: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes ANSI escape sequences (colours) from a log line.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Server {
    /// Starts `tokenmint --config <config> serve` and waits (up to 120 s) for the
    /// "listening on http://ADDR" log line.
    fn start(config: &Path, cwd: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmint"))
            .arg("--config")
            .arg(config)
            .arg("serve")
            .current_dir(cwd)
            // Not NO_COLOR: logs to a pipe must come without colours by themselves.
            .env_remove("NO_COLOR")
            .env("RUST_LOG", "info")
            .env_remove("TOKENMINT_CONFIG")
            .env_remove("TOKENMINT_ENV")
            .env_remove("TOKENMINT__MONGO__URI")
            .env_remove("TOKENMINT__MONGO__DATABASE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tokenmint binary runs");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let coloured = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        {
            let log = log.clone();
            let coloured = coloured.clone();
            // Keeps draining stderr for the life of the child, so it never blocks on a
            // full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if line.contains('\u{1b}') {
                        coloured.lock().unwrap().push(line.clone());
                    }
                    let line = strip_ansi(&line);
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            });
        }
        let mut server = Server {
            child,
            address: String::new(),
            log,
            coloured,
        };
        server.address = server.wait_for_address(&rx, Duration::from_secs(120));
        server
    }

    fn wait_for_address(&mut self, lines: &Receiver<String>, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once("listening on http://") {
                        let address = rest.split_whitespace().next().unwrap_or_default();
                        assert!(
                            address.parse::<std::net::SocketAddr>().is_ok(),
                            "bad address in {line:?}"
                        );
                        return format!("http://{address}");
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no \"listening on\" within {timeout:?}:\n{}", self.logs())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!(
                        "tokenmint exited ({status:?}) before listening:\n{}",
                        self.logs()
                    )
                }
            }
        }
    }

    /// Asserts that no log line carried colour codes (stderr is a pipe, not a terminal).
    fn assert_plain_logs(&self) {
        let coloured = self.coloured.lock().unwrap();
        assert!(
            coloured.is_empty(),
            "ANSI colours in piped logs: {:?}",
            coloured.first()
        );
    }

    fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the exit.
    fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: plain kill(2) on our own child's pid, which has not been reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "tokenmint did not exit within {timeout:?} of SIGTERM:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn write_config(dir: &Path, data_dir: &Path) -> PathBuf {
    let config = format!(
        r#"[server]
bind = "127.0.0.1:0"

[mongo]
uri = ""
database = "tokenmint_embedded_test"

[mongo.embedded]
binary = "{binary}"
data_dir = "{data}"

[[auth.keys]]
id = "e2e-admin"
sha256 = "{hash}"
scopes = ["admin"]
"#,
        binary = MONGOD,
        data = data_dir.display(),
        hash = key_hash(KEY),
    );
    let path = dir.join("tokenmint.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// The port the embedded mongod of `data_dir` uses.
fn mongod_port(data_dir: &Path) -> u16 {
    std::fs::read_to_string(data_dir.join("tokenmint-port"))
        .expect("the port is remembered in the data directory")
        .trim()
        .parse()
        .unwrap()
}

/// Asserts that nothing listens on the embedded mongod's port any more and that mongod
/// released its data directory cleanly (an empty `mongod.lock`).
fn assert_mongod_stopped(data_dir: &Path) {
    let port = mongod_port(data_dir);
    let refused = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .is_err();
    assert!(refused, "mongod still accepts connections on port {port}");
    let lock = std::fs::metadata(data_dir.join("mongod.lock")).expect("mongod.lock exists");
    assert_eq!(lock.len(), 0, "a clean shutdown leaves mongod.lock empty");
    let holders = processes_naming(data_dir);
    assert!(
        holders.is_empty(),
        "still running on {data_dir:?}: {holders:?}"
    );
}

/// Command lines of live processes that mention `path` (Linux /proc).
fn processes_naming(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle))
        .collect()
}

fn issuance() -> Value {
    json!({
        "provider": "stripe",
        "accountId": "acct_1",
        "paymentIntentId": "pi_embedded",
        "owner": "65f1a0c2b3d4e5f601234567",
        "tokenType": "standard",
        "quantity": 3,
    })
}

fn token_ids(body: &Value) -> Vec<String> {
    body["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("tokens in {body}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn post_issuance(http: &reqwest::Client, server: &Server) -> (u16, Value) {
    let response = http
        .post(server.url("/v1/issuances"))
        .bearer_auth(KEY)
        .json(&issuance())
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

async fn readyz(http: &reqwest::Client, server: &Server) -> u16 {
    http.get(server.url("/readyz"))
        .send()
        .await
        .expect("request sent")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_embedded_mongod_survives_a_restart() {
    assert!(
        Path::new(MONGOD).is_file(),
        "{MONGOD} missing: run scripts/install-mongod.sh"
    );
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path(), &data_dir);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    // First start: a fresh data directory.
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    assert!(
        processes_naming(&data_dir)
            .iter()
            .any(|cmdline| cmdline.contains("mongod")),
        "the embedded mongod runs on {data_dir:?}"
    );
    let (status, first) = post_issuance(&http, &server).await;
    assert_eq!(status, 201, "{first}\n{}", server.logs());
    assert_eq!(first["created"], 3);
    let ids = token_ids(&first);
    assert_eq!(ids.len(), 3);
    let status = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    assert_mongod_stopped(&data_dir);
    let port = mongod_port(&data_dir);
    server.assert_plain_logs();
    let first_logs = server.logs();
    assert!(
        first_logs.contains("embedded mongod stopped"),
        "mongod was stopped, not killed:\n{first_logs}"
    );
    drop(server);

    // Second start on the same data: the issuance is still there and replays.
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    let (status, replay) = post_issuance(&http, &server).await;
    assert_eq!(status, 200, "{replay}\n{}", server.logs());
    assert_eq!(replay["created"], 0);
    assert_eq!(token_ids(&replay), ids, "the same tokens");
    assert_eq!(replay["issuance"]["id"], first["issuance"]["id"]);
    assert_eq!(mongod_port(&data_dir), port, "mongod came back on its port");
    let read = http
        .get(server.url("/v1/issuances/stripe/acct_1/pi_embedded"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let read: Value = read.json().await.unwrap();
    assert_eq!(token_ids(&read), ids);
    let status = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    assert_mongod_stopped(&data_dir);
}
