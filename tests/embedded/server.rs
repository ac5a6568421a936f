//! The real binary as the embedded-mode tests run it: `tokenmint --config … serve` with
//! its log captured (colour codes stripped, coloured lines kept apart), one-shot operator
//! commands, and the requests the tests send.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokenmint_test_support::tokenmint_binary;

use super::KEY;

/// A running `tokenmint serve`; killed (with its mongod, via the parent-death signal) if
/// the test fails before it stopped.
pub(super) struct Server {
    pub(super) child: Child,
    pub(super) address: String,
    /// Every stderr line so far (colour codes removed), for failure messages.
    pub(super) log: Arc<Mutex<Vec<String>>>,
    /// The raw stderr lines that carried ANSI escape codes.
    pub(super) coloured: Arc<Mutex<Vec<String>>>,
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
pub(super) fn tokenmint(config: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(tokenmint_binary());
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
pub(super) fn run(mut command: Command) -> (i32, String, String) {
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
    pub(super) fn start(config: &Path, cwd: &Path) -> Server {
        Self::spawn(tokenmint(config, cwd, &["serve"]))
    }

    /// [`Server::start`] as a terminal's foreground job: the service leads a new process
    /// group (its pid is the group id), so a test can signal the whole group as Ctrl-C
    /// does.
    pub(super) fn start_in_own_group(config: &Path, cwd: &Path) -> Server {
        use std::os::unix::process::CommandExt;
        let mut command = tokenmint(config, cwd, &["serve"]);
        command.process_group(0);
        Self::spawn(command)
    }

    /// Spawns `command` (a `serve`) and waits (up to 120 s) for its listening address.
    fn spawn(mut command: Command) -> Server {
        let mut child = command
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

    pub(super) fn wait_for_address(
        &mut self,
        lines: &Receiver<String>,
        timeout: Duration,
    ) -> String {
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
    pub(super) fn assert_plain_logs(&self) {
        let coloured = self.coloured.lock().unwrap();
        assert!(
            coloured.is_empty(),
            "ANSI colours in piped logs: {:?}",
            coloured.first()
        );
    }

    pub(super) fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// SIGTERM from a test on a multi-threaded runtime; asserts a clean exit within 60 s.
    pub(super) fn stop(&mut self) {
        let status = tokio::task::block_in_place(|| self.terminate(Duration::from_secs(60)));
        assert!(status.success(), "exit {status:?}\n{}", self.logs());
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the exit.
    pub(super) fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: plain kill(2) on our own child's pid, which has not been reaped yet.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
        self.wait_for_exit(timeout)
    }

    /// Sends SIGINT to the service's whole process group, as a terminal's Ctrl-C does
    /// (the service must have been started with [`Server::start_in_own_group`]).
    pub(super) fn interrupt_group(&self) {
        let group = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on the process group our unreaped child leads.
        let rc = unsafe { libc::kill(-group, libc::SIGINT) };
        assert_eq!(rc, 0, "kill(-pgid, SIGINT)");
    }

    /// Waits (up to `timeout`) for the exit.
    pub(super) fn wait_for_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "tokenmint did not exit within {timeout:?} of its signal:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(super) fn issuance() -> Value {
    json!({
        "provider": "stripe",
        "accountId": "acct_1",
        "paymentIntentId": "pi_embedded",
        "owner": "65f1a0c2b3d4e5f601234567",
        "tokenType": "standard",
        "quantity": 3,
    })
}

/// An issuance in flight, sent by hand over its own connection: its headers and the first
/// half of its body are on the wire, the rest held back, so the service holds a request
/// it has begun and cannot finish until the test says so.
pub(super) struct HalfSentIssuance {
    stream: tokio::net::TcpStream,
    rest: String,
}

impl HalfSentIssuance {
    /// Connects to `address` (`host:port`) and sends the headers and half of the body;
    /// returns once the service has had 200 ms to read them.
    pub(super) async fn start(address: impl tokio::net::ToSocketAddrs) -> Self {
        use tokio::io::AsyncWriteExt;
        let body = issuance().to_string();
        let (first, rest) = body.split_at(body.len() / 2);
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let head = format!(
            "POST /v1/issuances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(first.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        Self {
            stream,
            rest: rest.to_owned(),
        }
    }

    /// Sends the rest of the body and reads the whole answer, as text (30 s at most).
    pub(super) async fn finish(mut self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(self.rest.as_bytes()).await.unwrap();
        let mut response = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            self.stream.read_to_string(&mut response),
        )
        .await
        .unwrap()
        .unwrap();
        response
    }
}

pub(super) async fn post_issuance(http: &reqwest::Client, server: &Server) -> (u16, Value) {
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

pub(super) async fn readyz(http: &reqwest::Client, server: &Server) -> u16 {
    http.get(server.url("/readyz"))
        .send()
        .await
        .expect("request sent")
        .status()
        .as_u16()
}

/// A client for a server whose idle keep-alive connections close quickly (a short
/// header-read timeout): no pooled connection is reused, so none is caught closing.
pub(super) fn unpooled_client() -> reqwest::Client {
    tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// The development key printed by a start (the line holding only the key).
pub(super) fn printed_dev_key(logs: &str) -> String {
    logs.lines()
        .map(str::trim)
        .find(|line| line.starts_with("tm_dev_") && !line.contains(' '))
        .unwrap_or_else(|| panic!("no development key printed:\n{logs}"))
        .to_owned()
}
