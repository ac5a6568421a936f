//! The embedded mode end to end, with the real binary: `tokenmint serve` with no
//! `mongo.uri` starts its own mongod on a data directory, serves, stops it on SIGTERM,
//! and a second start on the same directory finds the data again. Operator commands run
//! beside it use its mongod and leave it running; the development key survives restarts;
//! `keys new` prints a usable entry; production refuses the embedded mongod; a failed
//! start stops mongod cleanly; slow clients are cut off; `/readyz` turns 503 as soon as
//! shutdown begins.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokenmint::http::auth::{ApiKeys, key_hash};
use tokenmint::settings::Settings;
use tokenmint::startup::Application;

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

/// `tokenmint --config <config> ARGS` in `cwd`, with none of the caller's tokenmint
/// environment.
fn tokenmint(config: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokenmint"));
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(cwd)
        // Not NO_COLOR: logs to a pipe must come without colours by themselves.
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .env_remove("TOKENMINT_CONFIG")
        .env_remove("TOKENMINT_ENV")
        .env_remove("TOKENMINT__MONGO__URI")
        .env_remove("TOKENMINT__MONGO__DATABASE")
        .stdin(Stdio::null());
    command
}

/// Runs a command to its end (at most 120 s); its exit code, stdout and stderr.
fn run(mut command: Command) -> (i32, String, String) {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tokenmint binary runs");
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of our own child, which the thread above has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{command:?} did not finish within 120 s");
        }
    };
    (
        output.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        strip_ansi(&String::from_utf8_lossy(&output.stderr)),
    )
}

impl Server {
    /// Starts `tokenmint --config <config> serve` and waits (up to 120 s) for the
    /// "listening on http://ADDR" log line.
    fn start(config: &Path, cwd: &Path) -> Server {
        let mut child = tokenmint(config, cwd, &["serve"])
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

/// The test configuration: the embedded mongod on `data_dir`, port 0, `server` lines
/// added to `[server]`, and the test key unless `with_key` is false.
fn config_text(data_dir: &Path, server: &str, with_key: bool) -> String {
    let mut config = format!(
        r#"[server]
bind = "127.0.0.1:0"
{server}

[mongo]
uri = ""
database = "tokenmint_embedded_test"

[mongo.embedded]
binary = "{binary}"
data_dir = "{data}"
"#,
        binary = MONGOD,
        data = data_dir.display(),
    );
    if with_key {
        config.push_str(&format!(
            "\n[[auth.keys]]\nid = \"e2e-admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
            key_hash(KEY)
        ));
    }
    config
}

fn write_config_with(dir: &Path, data_dir: &Path, server: &str, with_key: bool) -> PathBuf {
    let path = dir.join("tokenmint.toml");
    std::fs::write(&path, config_text(data_dir, server, with_key)).unwrap();
    path
}

fn write_config(dir: &Path, data_dir: &Path) -> PathBuf {
    write_config_with(dir, data_dir, "", true)
}

/// The pid in the data directory's `mongod.lock`: the mongod holding it, if one runs.
fn lock_pid(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("mongod.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(libc::pid_t::try_from(pid).unwrap(), 0) == 0 }
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

/// A client for a server whose idle keep-alive connections close quickly (a short
/// header-read timeout): no pooled connection is reused, so none is caught closing.
fn unpooled_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_use_the_running_mongod_and_leave_it_running() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "header_read_timeout_ms = 1000", true);
    let http = unpooled_client();
    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(readyz(&http, &server).await, 200, "{}", server.logs());
    let (status, body) = post_issuance(&http, &server).await;
    assert_eq!(status, 201, "{body}\n{}", server.logs());
    let pid = lock_pid(&data_dir).expect("the service's mongod holds the data directory");

    for args in [
        &["verify"][..],
        &["migrate", "--dry-run"],
        &["duplicates"],
        &["verify", "--repair"],
    ] {
        let (code, stdout, stderr) =
            tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), args)));
        assert_eq!(code, 0, "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("using the embedded mongod already running"),
            "{args:?} did not use the running mongod:\n{stderr}"
        );
        assert!(
            !stderr.contains("started embedded mongod"),
            "{args:?} started a second mongod:\n{stderr}"
        );
        assert_eq!(lock_pid(&data_dir), Some(pid), "{args:?} replaced mongod");
        assert!(alive(pid), "{args:?} stopped the service's mongod");
        assert_eq!(
            readyz(&http, &server).await,
            200,
            "{args:?} took the database away:\n{}",
            server.logs()
        );
    }

    // A second `serve` on the same data is refused, and the first keeps its mongod.
    let (code, _, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["serve"])));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("already runs on"), "{stderr}");
    assert_eq!(lock_pid(&data_dir), Some(pid));
    assert_eq!(readyz(&http, &server).await, 200);

    // A client that sends half a request line is cut off after the header-read timeout.
    let address = server.address.trim_start_matches("http://").to_owned();
    let took = tokio::task::block_in_place(|| {
        // Timed from before the connection exists, so never shorter than the server's.
        let started = Instant::now();
        let mut slow = std::net::TcpStream::connect(&address).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        slow.write_all(b"GET /hea").unwrap();
        let mut rest = Vec::new();
        // EOF (or a reset) once the server closes it; a read timeout would be an error.
        match slow.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}"),
        }
        started.elapsed()
    });
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(15),
        "closed after {took:?}"
    );
    assert_eq!(readyz(&http, &server).await, 200);

    let status = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    assert_mongod_stopped(&data_dir);

    // With no service running, a command starts its own mongod and stops it after.
    let (code, stdout, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["verify"])));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("started embedded mongod"), "{stderr}");
    assert!(stderr.contains("embedded mongod stopped"), "{stderr}");
    assert_mongod_stopped(&data_dir);
}

/// The development key printed by a start (the line holding only the key).
fn printed_dev_key(logs: &str) -> String {
    logs.lines()
        .map(str::trim)
        .find(|line| line.starts_with("tm_dev_") && !line.contains(' '))
        .unwrap_or_else(|| panic!("no development key printed:\n{logs}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_key_survives_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config_with(dir.path(), &data_dir, "", false);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let authorized = |server: &Server, key: &str| {
        let request = http
            .get(server.url("/v1/issuances/stripe/acct_1/pi_nothing"))
            .bearer_auth(key);
        async move { request.send().await.unwrap().status().as_u16() }
    };

    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    let key = printed_dev_key(&server.logs());
    let file = data_dir.join("tokenmint-dev-key");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{file:?} has mode {mode:o}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), key);
    assert_eq!(authorized(&server, &key).await, 404, "{}", server.logs());
    assert_eq!(authorized(&server, "tm_dev_wrong").await, 401);
    let status = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    drop(server);

    let (code, stdout, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["keys", "dev"])));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), key);

    let mut server = tokio::task::block_in_place(|| Server::start(&config, dir.path()));
    assert_eq!(
        printed_dev_key(&server.logs()),
        key,
        "a new key after a restart"
    );
    assert_eq!(authorized(&server, &key).await, 404, "{}", server.logs());
    let status = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(60)));
    assert!(status.success(), "exit {status:?}\n{}", server.logs());
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), key);
    assert_mongod_stopped(&data_dir);
}

#[test]
fn keys_new_prints_a_key_once_and_a_pasteable_entry() {
    let dir = tempfile::tempdir().unwrap();
    // `keys new` needs no configuration: a broken one does not stop it.
    let config = dir.path().join("broken.toml");
    std::fs::write(&config, "[server\n").unwrap();
    let args = [
        "keys",
        "new",
        "--id",
        "billing \"backend\"",
        "--scopes",
        "read,issuances:write",
        "--accounts",
        "acct_1,acct_2",
    ];
    let (code, stdout, stderr) = run(tokenmint(&config, dir.path(), &args));
    assert_eq!(code, 0, "{stderr}");
    let key = stderr
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("tm_"))
        .unwrap_or_else(|| panic!("no key on stderr:\n{stderr}"))
        .to_owned();
    assert!(
        !stdout.contains(&key),
        "the key itself must not go into the config"
    );
    // The entry loads as configuration, and the key authenticates against it.
    let settings = Settings::with_overrides(&[&stdout]).unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    let entry = &settings.auth.keys[0];
    assert_eq!(entry.id, "billing \"backend\"");
    assert_eq!(entry.sha256, key_hash(&key));
    assert_eq!(entry.scopes, ["read", "issuances:write"]);
    assert_eq!(
        entry.accounts.as_deref(),
        Some(&["acct_1".to_owned(), "acct_2".to_owned()][..])
    );
    let principal = ApiKeys::from_settings(&settings.auth.keys)
        .authenticate(&key)
        .expect("the printed key matches its entry");
    assert!(principal.can_see("acct_2") && !principal.can_see("acct_3"));

    // Defaults: a generated id, admin; a fresh key every time.
    let (code, again, stderr) = run(tokenmint(&config, dir.path(), &["keys", "new"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("admin"), "{stderr}");
    let settings = Settings::with_overrides(&[&again]).unwrap();
    assert_eq!(settings.auth.keys[0].scopes, ["admin"]);
    assert!(settings.auth.keys[0].id.starts_with("key-"));
    assert_ne!(settings.auth.keys[0].sha256, entry.sha256);

    let (code, stdout, stderr) = run(tokenmint(
        &config,
        dir.path(),
        &["keys", "new", "--scopes", "read,tokens:burn"],
    ));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("unknown scope `tokens:burn`"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn production_refuses_the_embedded_mongod_before_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = write_config(dir.path(), &data_dir);
    for args in [&["serve"][..], &["verify"], &["migrate"]] {
        let mut command = tokenmint(&config, dir.path(), args);
        command.env("TOKENMINT_ENV", "production");
        let (code, _, stderr) = run(command);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains("TOKENMINT_ENV=production requires mongo.uri"),
            "{args:?}: {stderr}"
        );
        assert!(!data_dir.exists(), "{args:?} touched the data directory");
    }
    // No keys in production: refused before the database is contacted (the URI names a
    // port where nothing listens, so trying would fail differently, and later).
    let bare = dir.path().join("bare.toml");
    std::fs::write(
        &bare,
        "[mongo]\nuri = \"mongodb://127.0.0.1:9/?directConnection=true\"\n",
    )
    .unwrap();
    let mut command = tokenmint(&bare, dir.path(), &["serve"]);
    command.env("TOKENMINT_ENV", "production");
    let (code, _, stderr) = run(command);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("requires at least one [[auth.keys]]"),
        "{stderr}"
    );
    // `keys dev` has nothing to show in production.
    let mut command = tokenmint(&config, dir.path(), &["keys", "dev"]);
    command.env("TOKENMINT_ENV", "production");
    let (code, _, stderr) = run(command);
    assert_eq!(code, 2, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_stops_mongod_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // The listener is bound last, after mongod started and migrations ran: hold its port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = dir.path().join("taken.toml");
    let text = config_text(&data_dir, "", true).replace(
        "bind = \"127.0.0.1:0\"",
        &format!("bind = \"{}\"", taken.local_addr().unwrap()),
    );
    std::fs::write(&config, text).unwrap();
    let (code, _, stderr) =
        tokio::task::block_in_place(|| run(tokenmint(&config, dir.path(), &["serve"])));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot bind server.bind"), "{stderr}");
    assert!(stderr.contains("started embedded mongod"), "{stderr}");
    assert!(
        stderr.contains("embedded mongod stopped"),
        "not stopped cleanly:\n{stderr}"
    );
    assert!(!stderr.contains("SIGTERM"), "{stderr}");
    assert_mongod_stopped(&data_dir);
}

/// In process: `/readyz` reads the shutting-down flag, and `run_until_stopped` sets it
/// the moment shutdown begins, while an in-flight request is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_as_soon_as_shutdown_begins() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let settings =
        Settings::with_overrides(&[&config_text(&data_dir, "shutdown_grace_ms = 30000", true)])
            .unwrap();
    let http = unpooled_client();

    // The flag, set by hand: readyz answers 503 with the reason.
    let app = Application::build(&settings).await.expect("app builds");
    let base = format!("http://{}", app.local_addr());
    let flag = app.shutting_down();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    flag.begin();
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["reason"], "shutting down", "{body}");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The real thing: shutdown begins while a request is in flight.
    let app = Application::build(&settings)
        .await
        .expect("app builds again");
    let address = app.local_addr();
    let flag = app.shutting_down();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));
    let body = issuance().to_string();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/issuances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!flag.is_set());
    stop_tx.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !flag.is_set() {
        assert!(
            Instant::now() < deadline,
            "shutdown began but the flag is not set"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !server.is_finished(),
        "the in-flight request was not waited for"
    );
    stream.write_all(rest.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        stream.read_to_string(&mut response),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_mongod_stopped(&data_dir);
}
