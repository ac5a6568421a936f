//! The crash suites' requests: what an iteration sends, one attempt, retries until 2xx,
//! and the token ids stored for a payment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::RngExt;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokenmint::store::Store;
use tokenmint_test_support::{
    SERVICE_KEY, TokenIds, indexed_id, indexed_token_ids, issuance_body, payment_tokens,
};

use super::RETRY_DEADLINE;

/// Tokens per issuance: large enough that a kill lands mid-write.
pub(super) const QUANTITY: i64 = 1000;
pub(super) const PAYMENTS_PER_ITERATION: usize = 8;

/// One issuance request of an iteration (a payment may have two, sent at once).
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub(super) payment: String,
    pub(super) body: Value,
}

/// What one attempt got back.
pub(super) enum Answer {
    Ok(TokenIds),
    Status(u16, String),
    Failed(String),
}

pub(super) fn http_client() -> reqwest::Client {
    tokenmint_test_support::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// POSTs `body` to `/v1/issuances`: the status and the whole body, or why there is none.
/// A body cut off by the kill is no answer (and so no acknowledgment).
pub(super) async fn post_issuance(
    http: &reqwest::Client,
    base: &str,
    body: &Value,
) -> Result<(u16, String), String> {
    let response = http
        .post(format!("{base}/v1/issuances"))
        .bearer_auth(SERVICE_KEY)
        .json(body)
        .send()
        .await
        .map_err(|err| err.to_string())?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(|err| err.to_string())?;
    Ok((status, text))
}

pub(super) async fn send(http: &reqwest::Client, base: &str, body: &Value) -> Answer {
    let (status, text) = match post_issuance(http, base, body).await {
        Ok(answer) => answer,
        Err(err) => return Answer::Failed(err),
    };
    if !(200..300).contains(&status) {
        return Answer::Status(status, text);
    }
    let Ok(json) = serde_json::from_str::<Value>(&text) else {
        return Answer::Failed(format!("{status} with an unreadable body"));
    };
    Answer::Ok(indexed_token_ids(&json))
}

/// The payments of one iteration: mostly new, some issued earlier (a replay after a
/// crash must name the same tokens), some sent twice at once (a race during the crash).
pub(super) fn pick_requests(
    rng: &mut StdRng,
    mode: &str,
    label: &str,
    earlier: &[String],
) -> Vec<Request> {
    let mut requests = Vec::new();
    for slot in 0..PAYMENTS_PER_ITERATION {
        let payment = if !earlier.is_empty() && rng.random_bool(0.25) {
            earlier[rng.random_range(0..earlier.len())].clone()
        } else {
            format!("pi_crash_{mode}_{label}_{slot}")
        };
        if requests.iter().any(|r: &Request| r.payment == payment) {
            continue;
        }
        let mut body = issuance_body(&payment, QUANTITY);
        body["mode"] = json!(mode);
        let copies = if rng.random_bool(0.25) { 2 } else { 1 };
        for _ in 0..copies {
            requests.push(Request {
                payment: payment.clone(),
                body: body.clone(),
            });
        }
    }
    requests
}

/// The (tokenIndex, id) of every stored token of `payment`, in tokenIndex order.
pub(super) async fn stored_ids(store: &Store, payment: &str) -> TokenIds {
    payment_tokens(store.database(), payment)
        .await
        .iter()
        .map(indexed_id)
        .collect()
}

/// How the retries of one request went.
pub(super) struct Retried {
    pub(super) request: Request,
    pub(super) result: Result<TokenIds, String>,
    pub(super) attempts: u64,
    /// Non-2xx answers by status (0: no answer at all).
    pub(super) failures: BTreeMap<u16, u64>,
    pub(super) took: Duration,
}

/// Retries `request` against `base` until it is answered 2xx (or the deadline passes).
pub(super) async fn retry_until_ok(
    http: reqwest::Client,
    base: String,
    request: Request,
) -> Retried {
    let started = Instant::now();
    let mut attempts = 0;
    let mut failures = BTreeMap::new();
    let mut last = String::new();
    let result = loop {
        if started.elapsed() > RETRY_DEADLINE {
            break Err(format!("no 2xx within {RETRY_DEADLINE:?}; last: {last}"));
        }
        attempts += 1;
        let status = match send(&http, &base, &request.body).await {
            Answer::Ok(ids) => break Ok(ids),
            Answer::Status(status, body) if (400..500).contains(&status) => {
                break Err(format!("retry answered {status}: {body}"));
            }
            Answer::Status(status, body) => {
                last = format!("{status}: {body}");
                status
            }
            Answer::Failed(err) => {
                last = err;
                0
            }
        };
        *failures.entry(status).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Retried {
        request,
        result,
        attempts,
        failures,
        took: started.elapsed(),
    }
}
