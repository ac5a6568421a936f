//! Soak: a bounded run of mixed traffic against the real binary — new, replayed and
//! conflicting issuances in both modes, redeems, and webhooks delivered out of order and
//! twice — sampling the service's resident memory and open file descriptors. It passes when
//! no answer is a 5xx or an unexpected 4xx, the database is clean (`verify`), and neither
//! memory nor descriptors keep growing after warm-up.
//!
//! Ignored by default (it runs for minutes): `scripts/reliability.sh` runs it, with
//! `TOKENMINT_SOAK_SECS` (default 600) as its duration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokenmint::webhooks::signature::sign_stripe;
use tokenmint_test_support::{OWNER, SERVICE_KEY as KEY, ScratchDatabase, Service};
use tokio::sync::Mutex;

const SECRET: &str = "whsec_soak_test_secret_0123456789";
const CLIENTS: usize = 8;

/// Starts the real binary on `database`, with a Stripe provider and only warnings and the
/// startup lines logged (the soak measures the service, not its logging).
fn start(database: &str) -> Service {
    let secrets = format!("[\"{SECRET}\"]");
    Service::start_with(
        database,
        &[
            ("TOKENMINT__PROVIDERS__STRIPE__SCHEME", "stripe"),
            ("TOKENMINT__PROVIDERS__STRIPE__SECRETS", &secrets),
            ("RUST_LOG", "warn,tokenmint::startup=info"),
        ],
    )
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

/// The answers each action may get; any other is a failure.
fn expected(action: &str, status: u16) -> bool {
    match action {
        "issue" => status == 200 || status == 201,
        "conflict" => status == 409 || status == 201,
        "redeem" => status == 200 || status == 409,
        "webhook" => status == 200,
        _ => false,
    }
}

/// One client's loop: picks an action by a counter (deterministic mix), records statuses.
async fn client(
    id: usize,
    base: String,
    stop: Arc<AtomicBool>,
    statuses: Arc<Mutex<BTreeMap<(String, u16), u64>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
) {
    let http = reqwest::Client::new();
    let started = Instant::now();
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
        let status = match response {
            Ok(answer) => {
                let status = answer.status().as_u16();
                if !expected(action, status) {
                    // What the problem says, for the failure's message: a status alone
                    // does not tell which of a 503's causes it was.
                    let problem = answer.text().await.unwrap_or_default();
                    let at = started.elapsed().as_secs_f64();
                    unexpected
                        .lock()
                        .await
                        .push(format!("t={at:.1}s {action} {status}: {problem}"));
                }
                status
            }
            Err(err) => {
                unexpected
                    .lock()
                    .await
                    .push(format!("{action}: no answer: {err}"));
                0
            }
        };
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
    let database = ScratchDatabase::create("tokenmint_soak").await;
    let service = start(database.name());
    let pid = service.pid();
    let base = service.base.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(BTreeMap::new()));
    let unexpected = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            tokio::spawn(client(
                id,
                base.clone(),
                stop.clone(),
                statuses.clone(),
                unexpected.clone(),
            ))
        })
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
    let unexpected = unexpected.lock().await.clone();
    assert!(
        unexpected.is_empty(),
        "unexpected answers:\n{}\nthe service's last log lines:\n{}",
        unexpected.join("\n"),
        service.recent_log()
    );
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

    drop(service);
    let report = database.store().verify().await.unwrap();
    println!("{report}");
    assert!(report.is_clean(), "{report}");
}
