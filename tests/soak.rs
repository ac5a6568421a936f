//! Soak: a bounded run of mixed traffic against the real binary — new, replayed and
//! conflicting issuances in both modes, redeems, and webhooks delivered out of order and
//! twice — sampling the service's resident memory and open file descriptors. It passes when
//! no answer is a 5xx or an unexpected 4xx, the database is clean (`verify`), and neither
//! memory nor descriptors keep growing after warm-up.
//!
//! Ignored by default (it runs for minutes): `scripts/reliability.sh` runs it, with
//! `TOKENMINT_SOAK_SECS` (default 600) as its duration.

#[path = "api/helpers.rs"]
mod helpers;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use helpers::{OWNER, mongo_uri};
use serde_json::{Value, json};
use tokenmint::http::auth::key_hash;
use tokenmint::webhooks::signature::sign_stripe;
use tokio::sync::Mutex;

const KEY: &str = "soak-test-key";
const SECRET: &str = "whsec_soak_test_secret_0123456789";
const CLIENTS: usize = 8;

/// The service process, killed if the test fails.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(database: &str) -> (Service, String) {
    let keys = format!(
        "[{{id=\"soak\", sha256=\"{}\", scopes=[\"admin\"]}}]",
        key_hash(KEY)
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokenmint"))
        .arg("serve")
        .env("TOKENMINT__MONGO__URI", mongo_uri())
        .env("TOKENMINT__MONGO__DATABASE", database)
        .env("TOKENMINT__SERVER__BIND", "127.0.0.1:0")
        .env("TOKENMINT__AUTH__KEYS", keys)
        .env("TOKENMINT__RATE_LIMIT__PER_KEY_PER_SECOND", "100000")
        .env("TOKENMINT__RATE_LIMIT__BURST", "100000")
        .env("TOKENMINT__PROVIDERS__STRIPE__SCHEME", "stripe")
        .env(
            "TOKENMINT__PROVIDERS__STRIPE__SECRETS",
            format!("[\"{SECRET}\"]"),
        )
        .env("TOKENMINT__LOG__LEVEL", "warn,tokenmint::startup=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("tokenmint starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let address = loop {
        let line = lines
            .next()
            .expect("tokenmint exited before listening")
            .unwrap();
        if let Some(at) = line.find("listening on http://") {
            break line[at + "listening on http://".len()..].trim().to_owned();
        }
    };
    // Keep draining stderr so the service never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (Service(child), address)
}

/// (resident KiB, open file descriptors) of `pid`.
fn sample(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

/// One client's loop: picks an action by a counter (deterministic mix), records statuses.
async fn client(
    id: usize,
    base: String,
    stop: Arc<AtomicBool>,
    statuses: Arc<Mutex<BTreeMap<(String, u16), u64>>>,
) {
    let http = reqwest::Client::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let payment = format!("pi_soak_{id}_{}", n / 8);
        let (action, response) = match n % 8 {
            // new, then replayed (each payment is used for eight steps)
            0..=2 => {
                let mode = if n % 16 < 8 { "upsert" } else { "atomic" };
                let body = json!({"provider": "stripe", "paymentIntentId": payment, "owner": OWNER,
                    "tokenType": "standard", "quantity": 4, "mode": mode});
                (
                    "issue",
                    http.post(format!("{base}/v1/issuances"))
                        .bearer_auth(KEY)
                        .json(&body)
                        .send()
                        .await,
                )
            }
            // conflicting retry: other quantity
            3 => {
                let body = json!({"provider": "stripe", "paymentIntentId": payment, "owner": OWNER,
                    "tokenType": "standard", "quantity": 5});
                (
                    "conflict",
                    http.post(format!("{base}/v1/issuances"))
                        .bearer_auth(KEY)
                        .json(&body)
                        .send()
                        .await,
                )
            }
            // redeem the payment's first token
            4 | 5 => {
                let read = http
                    .get(format!("{base}/v1/issuances/stripe/default/{payment}"))
                    .bearer_auth(KEY)
                    .send()
                    .await;
                let token = match read {
                    Ok(r) if r.status() == 200 => r
                        .json::<Value>()
                        .await
                        .ok()
                        .and_then(|b| b["tokens"][0]["id"].as_str().map(str::to_owned)),
                    _ => None,
                };
                let Some(token) = token else { continue };
                (
                    "redeem",
                    http.post(format!("{base}/v1/tokens/{token}/redeem"))
                        .bearer_auth(KEY)
                        .send()
                        .await,
                )
            }
            // webhooks for another payment: succeeded, then an older processing, then a duplicate
            _ => {
                let web_payment = format!("pi_soak_web_{id}_{n}");
                let now = chrono::Utc::now().timestamp();
                let event = |event_id: String, kind: &str, created: i64| {
                    json!({"id": event_id, "type": format!("payment_intent.{kind}"), "created": created,
                        "data": {"object": {"id": web_payment, "metadata": {"tokenmint_owner": OWNER,
                        "tokenmint_token_type": "standard", "tokenmint_quantity": "2"}}}}).to_string()
                };
                let succeeded = event(format!("evt_{id}_{n}_s"), "succeeded", now);
                let late = event(format!("evt_{id}_{n}_p"), "processing", now - 30);
                let mut last = None;
                for body in [&succeeded, &late, &succeeded] {
                    last = Some(
                        http.post(format!("{base}/v1/webhooks/stripe"))
                            .header(
                                "stripe-signature",
                                sign_stripe(SECRET, now, body.as_bytes()),
                            )
                            .body(body.clone())
                            .send()
                            .await,
                    );
                }
                ("webhook", last.unwrap())
            }
        };
        let status = response.map(|r| r.status().as_u16()).unwrap_or(0);
        *statuses
            .lock()
            .await
            .entry((action.to_owned(), status))
            .or_default() += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: run by scripts/reliability.sh (TOKENMINT_SOAK_SECS)"]
async fn mixed_traffic_for_minutes_without_errors_or_growth() {
    let seconds: u64 = std::env::var("TOKENMINT_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let database = format!("tokenmint_soak_{}", uuid::Uuid::new_v4().simple());
    let (service, base) = start(&database);
    let pid = service.0.id();
    let base = format!("http://{base}");
    let stop = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(BTreeMap::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, base.clone(), stop.clone(), statuses.clone())))
        .collect();

    let started = Instant::now();
    let interval = Duration::from_secs((seconds / 20).max(1));
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(interval).await;
        let (rss, fds) = sample(pid);
        println!(
            "t={:>5.0}s rss={rss} KiB fds={fds}",
            started.elapsed().as_secs_f64()
        );
        samples.push((rss, fds));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    let statuses = statuses.lock().await.clone();
    println!("answers by (action, status): {statuses:?}");
    let expected = |action: &str, status: u16| match action {
        "issue" => status == 200 || status == 201,
        "conflict" => status == 409 || status == 201,
        "redeem" => status == 200 || status == 409,
        "webhook" => status == 200,
        _ => false,
    };
    let unexpected: Vec<_> = statuses
        .iter()
        .filter(|((a, s), _)| !expected(a, *s))
        .collect();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    let total: u64 = statuses.values().sum();
    println!("{total} requests in {seconds} s");

    // Growth: compare the last quarter with the second quarter (after warm-up).
    let quarter = samples.len() / 4;
    if quarter > 0 {
        let avg = |s: &[(u64, usize)]| s.iter().map(|x| x.0).sum::<u64>() / s.len() as u64;
        let (early, late) = (
            avg(&samples[quarter..2 * quarter]),
            avg(&samples[3 * quarter..]),
        );
        println!("rss after warm-up {early} KiB, at the end {late} KiB");
        assert!(
            late <= early + early / 4 + 4096,
            "memory keeps growing: {early} KiB -> {late} KiB"
        );
        let max_fds = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let end_fds = samples.last().map(|s| s.1).unwrap_or(0);
        assert!(
            end_fds <= samples[quarter].1 + 16,
            "descriptors keep growing: max {max_fds}, end {end_fds}"
        );
    }

    let store = tokenmint::store::Store::connect(
        &mongo_uri(),
        &database,
        Duration::from_secs(5),
        4,
        tokenmint::store::StoreConfig::default(),
    )
    .await
    .unwrap();
    let report = store.verify().await.unwrap();
    println!("{report}");
    assert!(report.is_clean(), "{report}");
    store.database().drop().await.unwrap();
    drop(service);
}
