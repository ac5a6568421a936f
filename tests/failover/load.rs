//! The load: clients that issue new payments in both modes (sometimes twice at once) and
//! replay their own, retrying 5xx and connection errors until 2xx, recording every answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokenmint_test_support::{ADMIN_KEY, TokenIds, indexed_token_ids, is_full_set, issuance_body};

/// Tokens per issuance.
pub(super) const QUANTITY: i64 = 4;
/// How long one payment may be retried before the test calls it lost.
const RETRY_DEADLINE: Duration = Duration::from_secs(90);

/// One answer the service gave (or a connection failure), with when it came.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) at: Duration,
    pub(super) ok: bool,
    pub(super) status: u16,
}

/// Everything the clients saw.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub(super) attempts: Vec<Attempt>,
    /// Acknowledged answers: (payment, ids).
    pub(super) acknowledged: Vec<(String, TokenIds)>,
    pub(super) violations: Vec<String>,
}

impl Observed {
    pub(super) fn merge(&mut self, other: Observed) {
        self.attempts.extend(other.attempts);
        self.acknowledged.extend(other.acknowledged);
        self.violations.extend(other.violations);
    }
}

/// An issuance of `QUANTITY` tokens for `payment` in `mode`.
pub(super) fn issuance(payment: &str, mode: &str) -> Value {
    let mut body = issuance_body(payment, QUANTITY);
    body["mode"] = json!(mode);
    body
}

/// Issues `quantity` of `OWNER`'s tokens of `token_type` for `payment` through `base`,
/// once, asserting the 201: the stock a redemption scenario spends.
pub(super) async fn stock_tokens(
    http: &reqwest::Client,
    base: &str,
    payment: &str,
    token_type: &str,
    quantity: i64,
) {
    let mut body = issuance_body(payment, quantity);
    body["tokenType"] = json!(token_type);
    let answer = http
        .post(format!("{base}/v1/issuances"))
        .bearer_auth(ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .expect("issuance sent");
    assert_eq!(answer.status(), 201, "{payment}");
}

/// Sends `body` until it is answered 2xx (retrying 5xx and connection errors after a
/// short pause) or the deadline passes.
pub(super) async fn issue_until_ok(
    http: &reqwest::Client,
    base: &str,
    start: Instant,
    payment: &str,
    body: &Value,
) -> Observed {
    let mut observed = Observed::default();
    let first = Instant::now();
    loop {
        let result = http
            .post(format!("{base}/v1/issuances"))
            .bearer_auth(ADMIN_KEY)
            .json(body)
            .send()
            .await;
        let (status, answer) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.json::<Value>().await.ok())
            }
            Err(_) => (0, None),
        };
        let ok = (200..300).contains(&status) && answer.is_some();
        observed.attempts.push(Attempt {
            at: start.elapsed(),
            ok,
            status,
        });
        if ok {
            let ids = indexed_token_ids(answer.as_ref().unwrap());
            if !is_full_set(&ids, QUANTITY) {
                observed.violations.push(format!(
                    "{payment}: acknowledged with a wrong token set {ids:?}"
                ));
            }
            observed.acknowledged.push((payment.to_owned(), ids));
            return observed;
        }
        if (400..500).contains(&status) {
            observed.violations.push(format!(
                "{payment}: answered {status}: {}",
                answer.unwrap_or_default()
            ));
            return observed;
        }
        if first.elapsed() > RETRY_DEADLINE {
            observed.violations.push(format!(
                "{payment}: no 2xx within {RETRY_DEADLINE:?} (last status {status})"
            ));
            return observed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One client: new payments in a random mode (sometimes sent twice at once), and now and
/// then a replay of one of its acknowledged payments, until `stop`.
pub(super) async fn client(
    id: usize,
    seed: u64,
    base: String,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Observed {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(id as u64));
    let http = tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut observed = Observed::default();
    let mut mine: Vec<(String, String)> = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        if !mine.is_empty() && rng.random_bool(0.2) {
            let (payment, mode) = mine[rng.random_range(0..mine.len())].clone();
            let body = issuance(&payment, &mode);
            observed.merge(issue_until_ok(&http, &base, start, &payment, &body).await);
            continue;
        }
        n += 1;
        let mode = if rng.random_bool(0.5) {
            "upsert"
        } else {
            "atomic"
        };
        let payment = format!("pi_failover_{id}_{n}");
        let body = issuance(&payment, mode);
        if rng.random_bool(0.25) {
            // Twins: two callers (say, the webhook and the checkout) at the same moment.
            let (a, b) = tokio::join!(
                issue_until_ok(&http, &base, start, &payment, &body),
                issue_until_ok(&http, &base, start, &payment, &body)
            );
            observed.merge(a);
            observed.merge(b);
        } else {
            observed.merge(issue_until_ok(&http, &base, start, &payment, &body).await);
        }
        mine.push((payment, mode.to_owned()));
    }
    observed
}
