//! Group commit under a crash (`crash_group_commit_mixed_retries_exactly_once`, upsert
//! mode): concurrent issuances share the batch's database commands, and a SIGKILL
//! mid-batch must still leave every payment issued exactly once.
//!
//! Per iteration, on a fresh database, the seeded RNG draws `REQUESTS` issuance requests:
//! new payments (quantity 1..=200, one of `OWNERS`, one of `TOKEN_TYPES`), 30 % identical
//! retries of one of them and 10 % conflicting ones (same payment, another owner or
//! quantity), each retry sent at once with the others (in a shuffled order, so it may reach
//! the service first) or right after its original was answered. They go to a freshly
//! started `tokenmint`, which is SIGKILLed after a seeded 5–95 % of the time an uncrashed
//! load of the same shape took (the calibration, itself checked like an iteration), so that
//! batches are in flight. The service is restarted with `FAST_REPAIR`, and every request
//! without a final answer (2xx or 409) is sent again until it has one; a conflicting
//! request is sent once more only, so the record it may have claimed can be left to
//! self-repair. Once no record is `issuing` (self-repair waited for, bounded), EVERY
//! payment in the database is checked:
//! - its record is `issued`; its tokens are exactly tokenIndex 0..quantity-1, active, with
//!   the record's owner and type; no token lacks a record, no record lacks a request;
//! - it was answered 201 at most once, over every answer before and after the kill;
//! - every 2xx answer (201 or 200) names the record (id, owner, type, quantity), went to
//!   a request with the record's parameters, and names exactly the stored token ids;
//! - every 409 `idempotency_conflict` went to a request whose parameters differ from the
//!   record's: a conflicting retry that reached the service first became the record, and
//!   then its original and their identical retries are the conflicts;
//! - `Store::verify()` is clean.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use futures::future::join_all;
use mongodb::bson::doc;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokenmint::domain::{IssuanceStatus, TokenStatus};
use tokenmint::store::{IssuanceDoc, Store, TokenDoc};
use tokio::sync::watch;

use super::{
    DropDatabase, FAST_REPAIR, REPAIR_DEADLINE, RETRY_DEADLINE, Service, Tally, TokenIds,
    check_after_kill, connect_store, http_client, issuing_records, iterations, post_issuance, seed,
    token_ids,
};

/// Requests per load: `IDENTICAL` identical retries, `CONFLICTING` conflicting ones, the
/// rest new payments; with the retries sent at once, well over 64 are in flight together.
const REQUESTS: usize = 96;
const IDENTICAL: usize = REQUESTS * 30 / 100;
const CONFLICTING: usize = REQUESTS / 10;
const MAX_QUANTITY: i64 = 200;
const OWNERS: [&str; 4] = [
    "65f1a0c2b3d4e5f601234567",
    "65f1a0c2b3d4e5f601234568",
    "65f1a0c2b3d4e5f601234569",
    "65f1a0c2b3d4e5f60123456a",
];
const TOKEN_TYPES: [&str; 2] = ["standard", "premium"];
const ACCOUNT: &str = "acct_group";
/// The kill comes after this many percent of the uncrashed load's time.
const KILL_PERCENT: std::ops::RangeInclusive<u32> = 5..=95;

/// What a request is to the payment it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The first request drawn for a new payment.
    Original,
    /// The original's body again.
    Identical,
    /// The original's payment with another owner or quantity.
    Conflicting,
}

/// One request of a load.
#[derive(Debug, Clone)]
struct Call {
    payment: String,
    owner: &'static str,
    token_type: &'static str,
    quantity: i64,
    kind: Kind,
    /// The call (index in the load) whose answer this one waits for; `None`: sent at once.
    after: Option<usize>,
}

impl Call {
    fn body(&self) -> Value {
        json!({
            "provider": "stripe",
            "accountId": ACCOUNT,
            "paymentIntentId": self.payment,
            "owner": self.owner,
            "tokenType": self.token_type,
            "quantity": self.quantity,
            "mode": "upsert",
        })
    }

    /// Whether this call asks for what `record` holds.
    fn matches(&self, record: &IssuanceDoc) -> bool {
        self.owner == record.owner.to_hex()
            && self.token_type == record.token_type
            && self.quantity == record.quantity
    }

    fn describe(&self, index: usize) -> String {
        let after = self
            .after
            .map_or("at once".to_owned(), |j| format!("after #{j}"));
        format!(
            "{} request #{index} ({:?}, {after}, owner {}, {} {})",
            self.payment, self.kind, self.owner, self.quantity, self.token_type
        )
    }
}

/// The requests of one load, in sending order (shuffled).
fn pick_calls(rng: &mut StdRng, label: &str) -> Vec<Call> {
    let originals = REQUESTS - IDENTICAL - CONFLICTING;
    let mut calls: Vec<Call> = (0..originals)
        .map(|n| Call {
            payment: format!("pi_group_{label}_{n}"),
            owner: OWNERS.choose(rng).unwrap(),
            token_type: TOKEN_TYPES.choose(rng).unwrap(),
            quantity: rng.random_range(1..=MAX_QUANTITY),
            kind: Kind::Original,
            after: None,
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
enum Reply {
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
struct Issued {
    status: u16,
    record: String,
    owner: String,
    token_type: String,
    quantity: i64,
    ids: TokenIds,
}

impl Reply {
    fn is_final(&self) -> bool {
        !matches!(self, Reply::NoAnswer(_))
    }
}

async fn attempt(http: &reqwest::Client, base: &str, call: &Call) -> Reply {
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
            ids: token_ids(&body),
        }),
        409 if body["code"] == "idempotency_conflict" => Reply::Conflict,
        500..=599 => Reply::NoAnswer(format!("{status}: {text}")),
        _ => Reply::Unexpected(status, text),
    }
}

/// Sends `calls` to `service` (each at once, or once the call it follows is answered)
/// and, with `kill_after`, SIGKILLs the service after that long. The reply of each.
async fn send_load(
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
async fn resend_unanswered(
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

/// Waits (at most `REPAIR_DEADLINE`) until no record is `issuing`; how many still are.
async fn wait_for_self_repair(store: &Store) -> u64 {
    let started = Instant::now();
    loop {
        let left = issuing_records(store).await;
        if left == 0 || started.elapsed() > REPAIR_DEADLINE {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Counts over the scenario, for its summary line.
#[derive(Debug, Default)]
struct Counts {
    identical: u64,
    conflicting: u64,
    issuing_after_kill: u64,
    resent: u64,
    conflicting_unanswered: u64,
    left_to_self_repair: u64,
    slowest_self_repair: Duration,
    created: u64,
    replayed: u64,
    conflicts: u64,
    conflicting_won: u64,
    payments: u64,
    tokens: u64,
}

/// The final answers each call got, with when ("before the kill", …).
type Answers = Vec<Vec<(&'static str, Reply)>>;

/// Checks every payment of the database against `calls` and their `answers` (see the
/// module doc), adding to `counts` and returning the violations.
async fn check_payments(
    store: &Store,
    calls: &[Call],
    answers: &Answers,
    counts: &mut Counts,
) -> Vec<String> {
    let mut violations = Vec::new();
    let records: Vec<IssuanceDoc> = read_all(store, "issuances").await;
    let mut tokens_of: BTreeMap<String, Vec<TokenDoc>> = BTreeMap::new();
    for token in read_all::<TokenDoc>(store, "tokens").await {
        counts.tokens += 1;
        let payment = token.origin.payment_intent_id.clone();
        tokens_of.entry(payment).or_default().push(token);
    }
    let mut calls_of: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, call) in calls.iter().enumerate() {
        calls_of.entry(&call.payment).or_default().push(index);
    }

    for record in &records {
        counts.payments += 1;
        let payment = record.payment_intent_id.as_str();
        let describe = format!(
            "{payment} (record {}, owner {}, {} {}, {:?})",
            record.id, record.owner, record.quantity, record.token_type, record.status
        );
        let Some(indexes) = calls_of
            .get(payment)
            .filter(|_| record.account_id == ACCOUNT)
        else {
            violations.push(format!("{describe}: a record no request asked for"));
            continue;
        };
        let mut tokens = tokens_of.remove(payment).unwrap_or_default();
        tokens.sort_by_key(|t| t.token_index);
        violations.extend(
            check_record(record, &tokens)
                .into_iter()
                .map(|v| format!("{describe}: {v}")),
        );
        let stored: TokenIds = tokens
            .iter()
            .map(|t| (t.token_index, t.id.to_hex()))
            .collect();
        if indexes
            .iter()
            .any(|&i| calls[i].kind == Kind::Conflicting && calls[i].matches(record))
        {
            counts.conflicting_won += 1;
        }
        let mut created = 0;
        for &index in indexes {
            let call = &calls[index];
            for (when, reply) in &answers[index] {
                let who = format!("{} answered {when}", call.describe(index));
                if let Reply::Issued(issued) = reply
                    && issued.status == 201
                {
                    created += 1;
                }
                violations.extend(
                    check_answer(call, reply, record, &stored)
                        .into_iter()
                        .map(|v| format!("{who} {v}; the record: {describe}")),
                );
            }
        }
        if created > 1 {
            violations.push(format!("{describe}: answered 201 {created} times"));
        }
    }
    for (payment, tokens) in tokens_of {
        violations.push(format!(
            "{payment}: {} token(s) without a record",
            tokens.len()
        ));
    }
    for payment in calls_of.keys() {
        if !records.iter().any(|r| r.payment_intent_id == *payment) {
            violations.push(format!(
                "{payment}: no record, although its requests were sent until answered"
            ));
        }
    }
    for (index, call) in calls.iter().enumerate() {
        for (_, reply) in &answers[index] {
            match reply {
                Reply::Issued(issued) if issued.status == 201 => counts.created += 1,
                Reply::Issued(_) => counts.replayed += 1,
                Reply::Conflict => counts.conflicts += 1,
                _ => {}
            }
        }
        if call.kind != Kind::Conflicting && answers[index].is_empty() {
            violations.push(format!("{}: no final answer", call.describe(index)));
        }
    }
    let report = store.verify().await.expect("verify");
    if !report.is_clean() {
        violations.push(format!("verify:\n{report}"));
    }
    violations
}

/// Every document of `collection`.
async fn read_all<T>(store: &Store, collection: &str) -> Vec<T>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    let cursor = store
        .database()
        .collection::<T>(collection)
        .find(doc! {})
        .await
        .unwrap_or_else(|err| panic!("read {collection}: {err}"));
    cursor
        .try_collect()
        .await
        .unwrap_or_else(|err| panic!("read {collection}: {err}"))
}

/// A record and its tokens (in tokenIndex order): issued, exactly tokenIndex
/// 0..quantity-1, all active with the record's owner and type.
fn check_record(record: &IssuanceDoc, tokens: &[TokenDoc]) -> Vec<String> {
    let mut violations = Vec::new();
    if record.status != IssuanceStatus::Issued {
        violations.push("not issued".to_owned());
    }
    let indexes: Vec<i64> = tokens.iter().map(|t| t.token_index).collect();
    if indexes != (0..record.quantity).collect::<Vec<_>>() {
        violations.push(format!(
            "{} tokens, not exactly tokenIndex 0..{}: {}",
            tokens.len(),
            record.quantity - 1,
            index_ranges(&indexes)
        ));
    }
    let foreign = tokens
        .iter()
        .filter(|t| {
            t.owner != record.owner
                || t.token_type != record.token_type
                || t.status != TokenStatus::Active
        })
        .count();
    if foreign > 0 {
        violations.push(format!(
            "{foreign} token(s) with another owner or type, or not active"
        ));
    }
    violations
}

/// One final answer to `call` against the payment's record and stored token ids: a 2xx
/// only for the record's parameters, naming the record and exactly the stored ids; a 409
/// only for other parameters; nothing else.
fn check_answer(
    call: &Call,
    reply: &Reply,
    record: &IssuanceDoc,
    stored: &TokenIds,
) -> Vec<String> {
    let mut violations = Vec::new();
    match reply {
        Reply::Issued(issued) => {
            if !call.matches(record) {
                violations.push(format!("{}, but asks for other parameters", issued.status));
            }
            if issued.record != record.id.to_hex()
                || issued.owner != record.owner.to_hex()
                || issued.token_type != record.token_type
                || issued.quantity != record.quantity
            {
                violations.push(format!(
                    "{} naming issuance {} (owner {}, {} {})",
                    issued.status, issued.record, issued.owner, issued.quantity, issued.token_type
                ));
            }
            if issued.ids != *stored {
                let differ = issued
                    .ids
                    .iter()
                    .zip(stored)
                    .filter(|(a, b)| a != b)
                    .count();
                violations.push(format!(
                    "{} naming {} tokens, {} stored, {differ} of the common ones differ",
                    issued.status,
                    issued.ids.len(),
                    stored.len()
                ));
            }
        }
        Reply::Conflict if call.matches(record) => violations
            .push("409 idempotency_conflict, but asks for what the record holds".to_owned()),
        Reply::Unexpected(status, body) => violations.push(format!("{status}: {body}")),
        Reply::Conflict | Reply::NoAnswer(_) => {}
    }
    violations
}

/// `0..99, 101..199` for a list of token indexes, to show a gap or an extra compactly.
fn index_ranges(indexes: &[i64]) -> String {
    let mut ranges: Vec<String> = Vec::new();
    let mut start = None;
    for (at, &index) in indexes.iter().enumerate() {
        let first = *start.get_or_insert(index);
        if indexes.get(at + 1) != Some(&(index + 1)) {
            ranges.push(if first == index {
                index.to_string()
            } else {
                format!("{first}..{index}")
            });
            start = None;
        }
    }
    ranges.join(", ")
}

/// The final answers: the first reply if final, then the one after the restart.
fn final_answers(first: Vec<Reply>, resent: Vec<Option<Reply>>, before: &'static str) -> Answers {
    first
        .into_iter()
        .zip(resent)
        .map(|(first, resent)| {
            [(before, Some(first)), ("after the restart", resent)]
                .into_iter()
                .filter_map(|(when, reply)| reply.map(|reply| (when, reply)))
                .filter(|(_, reply)| reply.is_final())
                .collect()
        })
        .collect()
}

/// One uncrashed load of the iterations' shape on a database of its own, checked like an
/// iteration; how long it took (the kills are a share of it).
async fn calibrate(rng: &mut StdRng, seed: u64, counts: &mut Counts) -> Duration {
    let database = format!("tokenmint_crash_{}", uuid::Uuid::new_v4().simple());
    let store = connect_store(&database).await;
    let _drop = DropDatabase(store.clone());
    let mut service = Service::start(&database);
    let calls = pick_calls(rng, "calibration");
    let started = Instant::now();
    let first = send_load(&mut service, &calls, None).await;
    let took = started.elapsed();
    let (resent, _) = resend_unanswered(&service.base, &calls, &first).await;
    let left = wait_for_self_repair(&store).await;
    let answers = final_answers(first, resent, "uncrashed");
    let mut calibration = Counts::default();
    let violations = check_payments(&store, &calls, &answers, &mut calibration).await;
    counts.payments += calibration.payments;
    counts.tokens += calibration.tokens;
    assert!(
        violations.is_empty(),
        "crash[group-commit] seed {seed}, uncrashed calibration load ({left} record(s) left issuing): {} violation(s):\n{}\nservice log:\n{}",
        violations.len(),
        violations.join("\n"),
        service.recent_log()
    );
    eprintln!(
        "crash[group-commit]: an uncrashed load of {} requests took {took:?}: {} answered 201, {} 200, {} 409",
        calls.len(),
        calibration.created,
        calibration.replayed,
        calibration.conflicts
    );
    took
}

pub(super) async fn scenario() {
    let seed = seed();
    let iterations = iterations();
    eprintln!(
        "crash[group-commit]: seed {seed} (TOKENMINT_CRASH_SEED={seed} replays it), {iterations} iteration(s)"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut counts = Counts::default();
    let calibration = calibrate(&mut rng, seed, &mut counts).await;

    for iteration in 0..iterations {
        // A fresh database each iteration: "every payment in the database" is this load's.
        let database = format!("tokenmint_crash_{}", uuid::Uuid::new_v4().simple());
        let store = connect_store(&database).await;
        let _drop = DropDatabase(store.clone());
        let mut loaded = Service::start(&database);
        let calls = pick_calls(&mut rng, &format!("i{iteration}"));
        let delay = calibration * rng.random_range(KILL_PERCENT) / 100;
        tally.requests += calls.len() as u64;
        counts.identical += calls.iter().filter(|c| c.kind == Kind::Identical).count() as u64;
        counts.conflicting += calls.iter().filter(|c| c.kind == Kind::Conflicting).count() as u64;

        // 1. Load, then SIGKILL after the delay.
        let first = send_load(&mut loaded, &calls, Some(delay)).await;
        tally.kills += 1;
        let acked_now = first
            .iter()
            .filter(|r| matches!(r, Reply::Issued(_)))
            .count() as u64;
        tally.acknowledged_before_kill += acked_now;
        tally.errors_before_kill += first.iter().filter(|r| !r.is_final()).count() as u64;

        // 2. What the kill left: no duplicate or orphan; short sets and `issuing` records.
        let before = store.verify().await.expect("verify after the kill");
        check_after_kill("upsert", &before, &mut tally, iteration);
        tally.partial_sets_before_retry += before.wrong_token_sets.count;
        let issuing_now = issuing_records(&store).await;
        counts.issuing_after_kill += issuing_now;

        // 3. Restart with fast self-repair; send again what got no final answer.
        let restarted = Service::start_with(&database, &FAST_REPAIR);
        let (resent, attempts) = resend_unanswered(&restarted.base, &calls, &first).await;
        tally.retry_attempts += attempts;
        let resent_now = resent.iter().flatten().count() as u64;
        counts.resent += resent_now;
        for (index, (call, reply)) in calls.iter().zip(&resent).enumerate() {
            match reply {
                // Sent once: its record, if it claimed one, is self-repair's.
                Some(Reply::NoAnswer(_)) if call.kind == Kind::Conflicting => {
                    counts.conflicting_unanswered += 1
                }
                Some(Reply::NoAnswer(last)) => tally.violations.push(format!(
                    "{}: no final answer within {RETRY_DEADLINE:?} after the restart; last: {last}",
                    call.describe(index)
                )),
                _ => {}
            }
        }

        // 4. Whatever is still `issuing` (a conflicting request that claimed its record
        // and was not answered, a lost `issued` mark) is self-repair's.
        let repairing = Instant::now();
        let left_after_retries = issuing_records(&store).await;
        counts.left_to_self_repair += left_after_retries;
        let still = wait_for_self_repair(&store).await;
        counts.slowest_self_repair = counts.slowest_self_repair.max(repairing.elapsed());
        if still > 0 {
            tally.violations.push(format!(
                "{still} record(s) still issuing {REPAIR_DEADLINE:?} after the retries"
            ));
        }

        // 5. Every payment of the database against every answer.
        let answers = final_answers(first, resent, "before the kill");
        let (created, replayed, conflicts) = (counts.created, counts.replayed, counts.conflicts);
        tally
            .violations
            .extend(check_payments(&store, &calls, &answers, &mut counts).await);
        tally.iterations += 1;
        if std::env::var_os("TOKENMINT_CRASH_VERBOSE").is_some() {
            eprintln!(
                "crash[group-commit] iteration {iteration}; the restarted service's log:\n{}",
                restarted.recent_log()
            );
        }
        eprintln!(
            "crash[group-commit] iteration {}/{iterations}: {} requests, killed after {} ms, {acked_now} acknowledged before the kill, {issuing_now} issuing record(s) and {} partial set(s) left, {resent_now} sent again ({attempts} attempts), {left_after_retries} left to self-repair, answered 201×{} 200×{} 409×{}, {} violation(s)",
            iteration + 1,
            calls.len(),
            delay.as_millis(),
            before.wrong_token_sets.count,
            counts.created - created,
            counts.replayed - replayed,
            counts.conflicts - conflicts,
            tally.violations.len(),
        );
        assert!(
            tally.violations.is_empty(),
            "crash[group-commit] seed {seed} iteration {iteration} (kill after {delay:?}): {} violation(s):\n{}\nthe restarted service's log:\n{}",
            tally.violations.len(),
            tally.violations.join("\n"),
            restarted.recent_log()
        );
    }
    eprintln!(
        "crash[group-commit] summary: seed={seed} iterations={} kills={} requests={} identical_retries={} conflicting_retries={} acknowledged_before_kill={} errors_before_kill={} issuing_records_after_kill={} partial_sets_after_kill={} sent_again={} retry_attempts={} conflicting_unanswered={} left_to_self_repair={} slowest_self_repair_ms={} answered_201={} answered_200={} answered_409={} conflicting_won={} payments={} tokens={} violations={}",
        tally.iterations,
        tally.kills,
        tally.requests,
        counts.identical,
        counts.conflicting,
        tally.acknowledged_before_kill,
        tally.errors_before_kill,
        counts.issuing_after_kill,
        tally.partial_sets_before_retry,
        counts.resent,
        tally.retry_attempts,
        counts.conflicting_unanswered,
        counts.left_to_self_repair,
        counts.slowest_self_repair.as_millis(),
        counts.created,
        counts.replayed,
        counts.conflicts,
        counts.conflicting_won,
        counts.payments,
        counts.tokens,
        tally.violations.len(),
    );
}
