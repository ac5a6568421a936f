//! The group-commit scenario's requests: what a load sends (originals, identical and
//! conflicting retries, some waiting for their original's answer), one attempt, a load
//! ended by SIGKILL, and the resending after the restart.

use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use serde_json::{Value, json};
use tokenmint::store::IssuanceDoc;
use tokenmint_test_support::{Service, TokenIds, indexed_token_ids};
use tokio::sync::watch;

use super::{ACCOUNT, CONFLICTING, IDENTICAL, MAX_QUANTITY, OWNERS, REQUESTS, TOKEN_TYPES};
use crate::RETRY_DEADLINE;
use crate::requests::{http_client, post_issuance};

/// What a request is to the payment it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The first request drawn for a new payment.
    Original,
    /// The original's body again.
    Identical,
    /// The original's payment with another owner or quantity.
    Conflicting,
}

/// One request of a load.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub(super) payment: String,
    pub(super) owner: &'static str,
    pub(super) token_type: &'static str,
    pub(super) quantity: i64,
    pub(super) kind: Kind,
    /// The call (index in the load) whose answer this one waits for; `None`: sent at once.
    pub(super) after: Option<usize>,
    /// The issuance mode asked for.
    pub(super) mode: &'static str,
}

impl Call {
    pub(super) fn body(&self) -> Value {
        json!({
            "provider": "stripe",
            "accountId": ACCOUNT,
            "paymentIntentId": self.payment,
            "owner": self.owner,
            "tokenType": self.token_type,
            "quantity": self.quantity,
            "mode": self.mode,
        })
    }

    /// Whether this call asks for what `record` holds.
    pub(super) fn matches(&self, record: &IssuanceDoc) -> bool {
        self.owner == record.owner.to_hex()
            && self.token_type == record.token_type
            && self.quantity == record.quantity
    }

    pub(super) fn describe(&self, index: usize) -> String {
        let after = self
            .after
            .map_or("at once".to_owned(), |j| format!("after #{j}"));
        format!(
            "{} request #{index} ({:?}, {after}, owner {}, {} {})",
            self.payment, self.kind, self.owner, self.quantity, self.token_type
        )
    }
}

/// The requests of one load in `mode`, in sending order (shuffled).
pub(super) fn pick_calls(rng: &mut StdRng, label: &str, mode: &'static str) -> Vec<Call> {
    let originals = REQUESTS - IDENTICAL - CONFLICTING;
    let mut calls: Vec<Call> = (0..originals)
        .map(|n| Call {
            payment: format!("pi_group_{label}_{n}"),
            owner: OWNERS.choose(rng).unwrap(),
            token_type: TOKEN_TYPES.choose(rng).unwrap(),
            quantity: rng.random_range(1..=MAX_QUANTITY),
            kind: Kind::Original,
            after: None,
            mode,
        })
        .collect();
    for retry in 0..IDENTICAL + CONFLICTING {
        let of = rng.random_range(0..originals);
        let mut call = Call {
            kind: Kind::Identical,
            after: rng.random_bool(0.5).then_some(of),
            ..calls[of].clone()
        };
        if retry >= IDENTICAL {
            call.kind = Kind::Conflicting;
            if rng.random_bool(0.5) {
                let others: Vec<&str> = OWNERS.into_iter().filter(|o| *o != call.owner).collect();
                call.owner = others.choose(rng).unwrap();
            } else {
                let quantity = rng.random_range(1..MAX_QUANTITY);
                // 1..=MAX_QUANTITY without the original's quantity.
                call.quantity = if quantity >= call.quantity {
                    quantity + 1
                } else {
                    quantity
                };
            }
        }
        calls.push(call);
    }
    // Shuffle the sending order, keeping each `after` on its original.
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.shuffle(rng);
    let mut position = vec![0; calls.len()];
    for (at, &index) in order.iter().enumerate() {
        position[index] = at;
    }
    order
        .into_iter()
        .map(|index| Call {
            after: calls[index].after.map(|of| position[of]),
            ..calls[index].clone()
        })
        .collect()
}

/// What one attempt was answered.
#[derive(Debug, Clone)]
pub(super) enum Reply {
    /// 201 or 200, with what it names.
    Issued(Issued),
    /// 409 `idempotency_conflict`.
    Conflict,
    /// Nothing final: no (complete) answer, or a 5xx. Sent again.
    NoAnswer(String),
    /// Any other answer: a violation.
    Unexpected(u16, String),
}

/// A 2xx answer: the issuance and the tokens it names.
#[derive(Debug, Clone)]
pub(super) struct Issued {
    pub(super) status: u16,
    pub(super) record: String,
    pub(super) owner: String,
    pub(super) token_type: String,
    pub(super) quantity: i64,
    pub(super) ids: TokenIds,
}

impl Reply {
    pub(super) fn is_final(&self) -> bool {
        !matches!(self, Reply::NoAnswer(_))
    }
}

pub(super) async fn attempt(http: &reqwest::Client, base: &str, call: &Call) -> Reply {
    let (status, text) = match post_issuance(http, base, &call.body()).await {
        Ok(answer) => answer,
        Err(err) => return Reply::NoAnswer(err),
    };
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let issuance = &body["issuance"];
    let text_of = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    match status {
        200 | 201 if body["tokens"].is_array() => Reply::Issued(Issued {
            status,
            record: text_of(&issuance["id"]),
            owner: text_of(&issuance["owner"]),
            token_type: text_of(&issuance["tokenType"]),
            quantity: issuance["quantity"].as_i64().unwrap_or(-1),
            ids: indexed_token_ids(&body),
        }),
        409 if body["code"] == "idempotency_conflict" => Reply::Conflict,
        500..=599 => Reply::NoAnswer(format!("{status}: {text}")),
        _ => Reply::Unexpected(status, text),
    }
}

/// Sends `calls` to `service` (each at once, or once the call it follows is answered)
/// and, with `kill_after`, SIGKILLs the service after that long. The reply of each.
pub(super) async fn send_load(
    service: &mut Service,
    calls: &[Call],
    kill_after: Option<Duration>,
) -> Vec<Reply> {
    let http = http_client();
    let (answered, waiting): (Vec<_>, Vec<_>) = calls.iter().map(|_| watch::channel(false)).unzip();
    let tasks: Vec<_> = calls
        .iter()
        .zip(answered)
        .map(|(call, answered)| {
            let (http, base, call) = (http.clone(), service.base.clone(), call.clone());
            let mut original = call.after.map(|of| waiting[of].clone());
            tokio::spawn(async move {
                if let Some(original) = &mut original {
                    // An error means the original's task is gone: send anyway.
                    let _ = original.wait_for(|answered| *answered).await;
                }
                let reply = attempt(&http, &base, &call).await;
                answered.send_replace(true);
                reply
            })
        })
        .collect();
    if let Some(delay) = kill_after {
        tokio::time::sleep(delay).await;
        service.kill();
    }
    join_all(tasks)
        .await
        .into_iter()
        .map(|task| task.expect("request task"))
        .collect()
}

/// Sends every call whose first reply was not final to `base` again: until it is final
/// (or `RETRY_DEADLINE` passes), a conflicting call once. `None` for calls not sent; the
/// number of attempts.
pub(super) async fn resend_unanswered(
    base: &str,
    calls: &[Call],
    first: &[Reply],
) -> (Vec<Option<Reply>>, u64) {
    let http = http_client();
    let resends = calls.iter().zip(first).map(|(call, first)| {
        let http = http.clone();
        async move {
            if first.is_final() {
                return (None, 0);
            }
            let started = Instant::now();
            let mut attempts = 0;
            loop {
                attempts += 1;
                let reply = attempt(&http, base, call).await;
                if reply.is_final()
                    || call.kind == Kind::Conflicting
                    || started.elapsed() > RETRY_DEADLINE
                {
                    return (Some(reply), attempts);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let resent: Vec<(Option<Reply>, u64)> = join_all(resends).await;
    let attempts = resent.iter().map(|(_, attempts)| attempts).sum();
    (
        resent.into_iter().map(|(reply, _)| reply).collect(),
        attempts,
    )
}
