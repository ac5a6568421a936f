//! The checkout kit in a real browser: the example page (`examples/checkout/`, its script
//! built from the typed client in `clients/typescript/`) served from one loopback origin,
//! tokenmint on another with that origin in `server.cors_origins`, and headless Chromium
//! driven by `examples/checkout/drive.mjs` (playwright-core). What an HTTP-level test
//! cannot see is what this one checks: the browser's CORS preflight lets the page's
//! request through, and the headers a checkout acts on are readable from its script.
//!
//! Needs Debian's Chromium (`scripts/install-chromium.sh`), node and the client's
//! `node_modules` (`npm ci --prefix clients/typescript`): `scripts/test.sh` installs them,
//! and without them this test fails, saying which is missing.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use mongodb::bson::doc;
use serde_json::Value;
use tokio::process::Command;

use crate::helpers::*;
use crate::prefer_wait::{WAITING, apply, until_waiters, until_waiting};
use crate::provider_events::PROVIDERS;

const CHROMIUM: &str = "/usr/bin/chromium";
/// The page's `Prefer: wait`, far above how long the test takes to send the event.
const WAIT_SECS: u64 = 20;
/// The most a step that runs node (the build, the whole browser run) may take.
const NODE_STEP_TIMEOUT: Duration = Duration::from_secs(180);

fn kit_path(relative: &str) -> PathBuf {
    workspace_root().join(relative)
}

/// Fails the test, naming the install step, unless Chromium, node and the client's
/// node modules are there: a browser test that skips itself proves nothing.
fn require_browser_kit() {
    assert!(
        Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} is missing: run scripts/install-chromium.sh (as root; scripts/test.sh does)"
    );
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|out| out.status.success()),
        "node is missing: the checkout kit needs Node.js 20 with npm, then \
         `npm ci --prefix clients/typescript` (scripts/test.sh runs it)"
    );
    assert!(
        kit_path("clients/typescript/node_modules/playwright-core").is_dir(),
        "the checkout client's node modules are missing: run \
         `npm ci --prefix clients/typescript` (scripts/test.sh does)"
    );
}

/// Runs `command` in the workspace root to its end, within [`NODE_STEP_TIMEOUT`]; the
/// child is killed if the test gives up on it.
async fn run_to_end(command: &mut Command, what: &str) -> Output {
    let child = command
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let output = tokio::time::timeout(NODE_STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: no end within {NODE_STEP_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The page's script, built from the client as it is (`npm run build:example`): once
/// per test binary, so that no test serves the file while another one writes it.
async fn build_page_script() {
    static BUILT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            run_to_end(
                Command::new("npm").args([
                    "run",
                    "--silent",
                    "--prefix",
                    "clients/typescript",
                    "build:example",
                ]),
                "building the checkout page's script",
            )
            .await;
        })
        .await;
}

/// A static file server for the example page on its own loopback port; stops when
/// dropped.
struct PageServer {
    origin: String,
    server: tokio::task::JoinHandle<()>,
}

impl PageServer {
    /// Builds the page's script, then serves the page.
    async fn start() -> PageServer {
        require_browser_kit();
        build_page_script().await;
        let read = |relative: &str| {
            let path = kit_path(relative);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let page = read("examples/checkout/index.html");
        let script = read("examples/checkout/dist/checkout.js");
        let router = Router::new()
            .route(
                "/",
                get(move || async move { ([(CONTENT_TYPE, "text/html; charset=utf-8")], page) }),
            )
            // A module script must come with a JavaScript type, or the browser refuses it.
            .route(
                "/dist/checkout.js",
                get(move || async move { ([(CONTENT_TYPE, "text/javascript")], script) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, router)
                .await
                .expect("the page server");
        });
        PageServer { origin, server }
    }

    /// A test app that lets this page's origin call it (`server.cors_origins`), with
    /// the providers and `extra` TOML.
    async fn api(&self, extra: &str) -> TestApp {
        let app = spawn_app_with(&format!(
            "{PROVIDERS}\n[server]\ncors_origins = [\"{}\"]\n{extra}",
            self.origin
        ))
        .await;
        assert_ne!(self.origin, app.address, "two origins: a real CORS call");
        app
    }

    /// The page's address with its form filled for `app`, the checkout key, and two
    /// tokens of `payment`; `wait` is the `Prefer: wait` seconds (empty: none).
    fn url(&self, app: &TestApp, payment: &str, wait: &str) -> String {
        format!(
            "{}/?api={}&key={REQUEST_KEY}&payment={payment}&owner={OWNER}&quantity=2&wait={wait}",
            self.origin, app.address
        )
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `drive.mjs` on the page at `url` with `args` (how many attempts, how), in the
/// background: the test acts on tokenmint meanwhile.
fn drive(url: String, args: &'static [&'static str]) -> tokio::task::JoinHandle<Output> {
    tokio::spawn(async move {
        run_to_end(
            Command::new("node")
                .args(["examples/checkout/drive.mjs", &url])
                .args(args),
            "driving the checkout page in Chromium",
        )
        .await
    })
}

/// One attempt as the page shows it: its `data-field` values and its tokens' ids.
struct Shown {
    fields: Value,
    tokens: Vec<String>,
}

impl Shown {
    fn field(&self, name: &str) -> &str {
        self.fields[name]
            .as_str()
            .unwrap_or_else(|| panic!("the page shows no {name}: {}", self.fields))
    }
}

/// The attempts `drive.mjs` printed, by number (the order they were sent in).
fn shown_attempts(output: &Output) -> Vec<Shown> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let run: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("drive.mjs printed no JSON ({e}): {stdout}"));
    run["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("no attempts in {run}"))
        .iter()
        .map(|attempt| Shown {
            fields: attempt["fields"].clone(),
            tokens: serde_json::from_value(attempt["tokens"].clone()).expect("token ids"),
        })
        .collect()
}

/// Waits until the page's request has reached tokenmint and is held there (its pending
/// record written, the waiter counted), or fails with what the browser run said if it
/// ended first.
async fn until_the_page_waits(
    app: &TestApp,
    payment: &str,
    browser: &mut tokio::task::JoinHandle<Output>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let pending = doc! { "paymentIntentId": payment, "status": "pending" };
    while app.count("issuances", pending.clone()).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the page sent no request for {payment} within 60 s"
        );
        if browser.is_finished() {
            let output = browser.await.expect("the browser run");
            panic!(
                "the browser run ended before the page's request waited: {}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_waiting(app, payment).await;
}

/// The whole checkout in Chromium: the page asks with `Prefer: wait`, is held until the
/// provider's signed success arrives, shows the tokens the database holds and, read from
/// script, `Preference-Applied` and `x-request-id`; asking again shows the replay
/// (`Idempotent-Replayed: true`) with the same tokens. A header the CORS layer did not
/// expose would read as null in the page, and fail this test.
#[tokio::test]
async fn a_checkout_page_in_a_browser_waits_for_its_tokens_and_reads_the_headers() {
    let page = PageServer::start().await;
    let _turn = WAITING.lock().await;
    let app = page.api("").await;
    let payment = "pi_browser";
    let mut browser = drive(page.url(&app, payment, &WAIT_SECS.to_string()), &["2"]);
    until_the_page_waits(&app, payment, &mut browser).await;
    apply(&app, "succeeded", payment, "2").await;
    let output = browser.await.expect("the browser run");
    let attempts = shown_attempts(&output);
    assert_eq!(
        attempts.len(),
        2,
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );

    let stored = app.stored_token_ids(payment).await;
    assert_eq!(stored.len(), 2, "the provider's quantity was issued");
    let states = app.token_states(payment).await;
    assert_eq!(states, [(0, "active".to_owned()), (1, "active".to_owned())]);
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": payment })
        .await;
    assert_eq!(record.get_str("status").unwrap(), "issued");
    assert_eq!(app.count("issuances", doc! {}).await, 1);

    // The held request: woken by the event with the tokens, and told it waited. Whether
    // it wrote the tokens or found them written by the webhook (a replay) is the race
    // the server decides; the page shows which.
    let [waited, replayed] = &attempts[..] else {
        unreachable!("two attempts")
    };
    let status = waited.field("status");
    assert!(["200", "201"].contains(&status), "{}", waited.fields);
    assert_eq!(waited.field("issuance"), "issued");
    assert_eq!(waited.tokens, stored, "the page shows the stored tokens");
    assert_eq!(
        waited.field("preference-applied"),
        format!("wait={WAIT_SECS}"),
        "Preference-Applied read from script: {}",
        waited.fields
    );
    let first_replayed = if status == "200" { "true" } else { "null" };
    assert_eq!(
        waited.field("idempotent-replayed"),
        first_replayed,
        "Idempotent-Replayed read from script, on a {status}: {}",
        waited.fields
    );

    // Asked again: a replay, answered at once, and the page can tell.
    assert_eq!(replayed.field("status"), "200", "{}", replayed.fields);
    assert_eq!(replayed.tokens, stored);
    assert_eq!(
        replayed.field("idempotent-replayed"),
        "true",
        "Idempotent-Replayed read from script: {}",
        replayed.fields
    );
    assert_eq!(replayed.field("preference-applied"), "null", "no wait");

    // x-request-id is readable, one per request.
    let ids = [waited.field("request-id"), replayed.field("request-id")];
    for id in ids {
        assert!(
            uuid::Uuid::parse_str(id).is_ok(),
            "x-request-id read from script: {id:?}"
        );
    }
    assert_ne!(ids[0], ids[1]);
    until_waiters(&app, 0.0).await;
}

/// Over its address's rate (one request a second), a checkout page's two requests sent
/// together: one is answered (202, pending: no wait asked), the other refused 429, and
/// the page reads that answer's `Retry-After` from script.
#[tokio::test]
async fn a_rate_limited_checkout_page_reads_retry_after() {
    let page = PageServer::start().await;
    let app = page
        .api("[rate_limit]\nper_address_per_second = 1\nper_address_burst = 1\n")
        .await;
    let payment = "pi_browser_limited";
    let output = drive(page.url(&app, payment, ""), &["2", "--at-once"])
        .await
        .expect("the browser run");
    let mut attempts = shown_attempts(&output);
    attempts.sort_by(|a, b| a.field("status").cmp(b.field("status")));
    let [pending, limited] = &attempts[..] else {
        panic!("two attempts: {}", String::from_utf8_lossy(&output.stdout))
    };

    assert_eq!(pending.field("status"), "202", "{}", pending.fields);
    assert_eq!(pending.field("issuance"), "pending");
    assert!(pending.tokens.is_empty());
    assert!(
        pending.fields.get("retry-after").is_none(),
        "no Retry-After row without one: {}",
        pending.fields
    );

    assert_eq!(limited.field("status"), "429", "{}", limited.fields);
    assert!(
        limited.field("problem").starts_with("rate_limited:"),
        "{}",
        limited.fields
    );
    let retry_after: u64 = limited
        .field("retry-after")
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After read from script: {}", limited.fields));
    assert!(retry_after >= 1, "{retry_after}");

    assert_eq!(
        app.count(
            "issuances",
            doc! { "paymentIntentId": payment, "status": "pending" }
        )
        .await,
        1
    );
    assert_eq!(app.count("tokens", doc! {}).await, 0);
}
