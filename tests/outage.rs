//! MongoDB outages: with the database paused or gone, requests answer 503
//! `database_unavailable` quickly (never hang) and readiness turns 503; when it comes back
//! the same service recovers by itself. `tokenmint_mongodb_up` follows the database with
//! nobody calling /readyz. And what a mongod prints before its log is open lands in that
//! log. Its own binary: it pauses its own mongod.

use std::time::{Duration, Instant};

use serde_json::json;
use tokenmint::embedded::EmbeddedMongo;
use tokenmint::http::auth::key_hash;
use tokenmint::settings::{EmbeddedMongoSettings, Settings};
use tokenmint::startup::Application;

const KEY: &str = "outage-test-key";
/// The configured server selection timeout; answers must come within it plus a margin.
const SELECTION_MS: u64 = 1500;
/// Generous: this is a behaviour test (no hang), not a benchmark.
const BOUND: Duration = Duration::from_secs(12);

fn signal(pid: u32, signal: i32) {
    // SAFETY: sending a signal to a child process we started.
    let rc = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

async fn issue(
    http: &reqwest::Client,
    base: &str,
    payment: &str,
) -> (u16, Option<String>, serde_json::Value, Duration) {
    let started = Instant::now();
    let response = http
        .post(format!("{base}/v1/issuances"))
        .bearer_auth(KEY)
        .json(&json!({"provider": "stripe", "paymentIntentId": payment, "owner": "65f1a0c2b3d4e5f601234567", "tokenType": "standard", "quantity": 2}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.json().await.unwrap_or_default();
    (status, retry_after, body, started.elapsed())
}

async fn wait_until_ok(http: &reqwest::Client, base: &str, payment: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, ..) = issue(http, base, payment).await;
        if status == 201 || status == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "service did not recover (last status {status})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_answers_503_fast_and_recovers_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mongo_settings = EmbeddedMongoSettings {
        binary: String::new(),
        data_dir: dir.path().join("mongo"),
    };
    let mongo = EmbeddedMongo::start(&mongo_settings)
        .await
        .expect("mongod starts");
    let pid = mongo.pid().unwrap();
    let config = format!(
        "[server]\nbind = \"127.0.0.1:0\"\nrequest_timeout_ms = 30000\n[mongo]\nuri = \"{}\"\ndatabase = \"outage\"\nserver_selection_timeout_ms = {SELECTION_MS}\n[[auth.keys]]\nid = \"t\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        mongo.uri(),
        key_hash(KEY)
    );
    let settings = Settings::with_overrides(&[&config]).unwrap();
    let app = Application::build(&settings).await.unwrap();
    let base = format!("http://{}", app.local_addr());
    let (_stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = stop_rx.await;
    }));
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(issue(&http, &base, "pi_before").await.0, 201);

    // 1. Paused database (SIGSTOP): connections stay open but nothing answers.
    signal(pid, libc::SIGSTOP);
    let (status, retry_after, body, elapsed) = issue(&http, &base, "pi_paused").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "database_unavailable");
    assert!(retry_after.is_some());
    assert!(elapsed < BOUND, "took {elapsed:?}");
    eprintln!("paused database: 503 after {elapsed:?}");
    assert!(!body.to_string().contains("Kind"), "no driver text: {body}");
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    signal(pid, libc::SIGCONT);
    wait_until_ok(&http, &base, "pi_paused").await;
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // 2. Database gone (clean stop), then back on the same data and port.
    mongo.stop().await;
    let (status, _, body, elapsed) = issue(&http, &base, "pi_gone").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "database_unavailable");
    assert!(elapsed < BOUND, "took {elapsed:?}");
    eprintln!("stopped database: 503 after {elapsed:?}");
    let mongo = EmbeddedMongo::start(&mongo_settings)
        .await
        .expect("mongod restarts");
    wait_until_ok(&http, &base, "pi_gone").await;
    // What was acknowledged before the outage is still there.
    let (status, ..) = issue(&http, &base, "pi_before").await;
    assert_eq!(status, 200);
    mongo.stop().await;
}

/// `tokenmint_mongodb_up` of a service, from its /metrics.
async fn database_up(http: &reqwest::Client, base: &str) -> Option<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("tokenmint_mongodb_up "))
        .and_then(|value| value.trim().parse().ok())
}

async fn wait_for_database_up(http: &reqwest::Client, base: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while database_up(http, base).await != Some(want) {
        assert!(
            Instant::now() < deadline,
            "tokenmint_mongodb_up never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The real binary in its own process (its own metrics recorder), on a mongod of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_gauge_follows_an_outage_without_readiness_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mongo = EmbeddedMongo::start(&EmbeddedMongoSettings {
        binary: String::new(),
        data_dir: dir.path().join("mongo"),
    })
    .await
    .expect("mongod starts");
    let pid = mongo.pid().unwrap();
    let selection = SELECTION_MS.to_string();
    let service = tokenmint_test_support::Service::start_with(
        "gauge",
        &[
            ("TOKENMINT__MONGO__URI", mongo.uri()),
            ("TOKENMINT__MONGO__SERVER_SELECTION_TIMEOUT_MS", &selection),
        ],
    );
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    wait_for_database_up(&http, &service.base, 1.0).await;

    signal(pid, libc::SIGSTOP);
    wait_for_database_up(&http, &service.base, 0.0).await;
    signal(pid, libc::SIGCONT);
    wait_for_database_up(&http, &service.base, 1.0).await;
    drop(service);
    mongo.stop().await;
}

/// A "mongod" that fails before opening its log, as a bad option or a locked data
/// directory makes the real one do: what it printed is in `mongod.log`, and the error
/// names that file.
#[tokio::test]
async fn what_mongod_prints_before_its_log_opens_is_kept_in_the_log() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("mongod");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'stdout: early words' \necho 'stderr: cannot open the data directory' >&2\nexit 48\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data_dir = dir.path().join("mongo");
    let err = EmbeddedMongo::start(&EmbeddedMongoSettings {
        binary: fake.to_str().unwrap().to_owned(),
        data_dir: data_dir.clone(),
    })
    .await
    .err()
    .expect("a mongod that exits is an error");
    let log_path = data_dir.join("mongod.log");
    assert!(
        err.to_string().contains(log_path.to_str().unwrap()),
        "the error names the log: {err}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("stderr: cannot open the data directory"),
        "{log}"
    );
    assert!(log.contains("stdout: early words"), "{log}");
}
