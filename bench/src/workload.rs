//! The closed loop: N virtual clients, each issuing one request at a time until the
//! deadline, against the service (HTTP), its store in-process, or one of the floors
//! (database operations issued directly). What each client sends — new payments, replays
//! of its completed payments, concurrent duplicate races — is drawn from the same seeded
//! generator for every target, so all see the same mix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use mongodb::bson::{DateTime, oid::ObjectId};
use tokenmint::domain::{
    AccountId, Actor, IssuanceMode, IssuanceParams, NewIssuance, Owner, PaymentIntentId,
    PaymentKey, Provider, Quantity, TokenType,
};
use tokenmint::issuing::{Caller, IssueError, IssueOutcome, Issuer};

use crate::floor::Floor;
use crate::http::Conn;
use crate::op_times::OpTimes;

/// What one scenario sends.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub concurrency: usize,
    pub quantity: u32,
    pub mode: IssuanceMode,
    /// Fraction of requests that replay one of the client's completed payments.
    pub replays: f64,
    /// Fraction of new payments sent twice at once, on two connections.
    pub races: f64,
}

/// One payment, as every target issues it.
#[derive(Debug, Clone)]
pub struct Payment {
    pub provider: &'static str,
    pub account_id: &'static str,
    pub payment_intent_id: String,
    pub owner: ObjectId,
    pub token_type: &'static str,
    pub quantity: u32,
    /// The paymentDate of the floors and the in-process store (the service over HTTP sets
    /// its own: the request carries none).
    pub date: DateTime,
}

impl Payment {
    fn json(&self, mode: IssuanceMode) -> Bytes {
        Bytes::from(format!(
            r#"{{"provider":"{}","accountId":"{}","paymentIntentId":"{}","owner":"{}","tokenType":"{}","quantity":{},"mode":"{}"}}"#,
            self.provider,
            self.account_id,
            self.payment_intent_id,
            self.owner.to_hex(),
            self.token_type,
            self.quantity,
            mode.as_str()
        ))
    }
}

/// How one request ended.
#[derive(Debug)]
pub struct Outcome {
    pub status: u16,
    /// Tokens this request inserted.
    pub created: u32,
    pub error: Option<String>,
}

impl Outcome {
    pub fn ok(status: u16, created: u32) -> Self {
        Self {
            status,
            created,
            error: None,
        }
    }

    pub fn error(status: u16, message: String) -> Self {
        Self {
            status,
            created: 0,
            error: Some(message),
        }
    }
}

/// What the load is sent to.
#[derive(Clone)]
pub enum Target {
    /// tokenmint over HTTP.
    Service { addr: SocketAddr, api_key: String },
    /// tokenmint's own issuing service, in the bench process: the service without HTTP.
    Store(Issuer),
    /// One of the floors (per-request or reference design): database operations issued directly.
    Floor(Floor),
}

/// One virtual client's state, kept across warm-up and measured segments.
pub struct Client {
    id: usize,
    rng: SplitMix64,
    seq: u64,
    owner: ObjectId,
    run_tag: String,
    completed: Vec<Payment>,
    conns: Vec<Conn>,
    times: OpTimes,
}

const COMPLETED_KEPT: usize = 4096;

impl Client {
    pub fn new(
        id: usize,
        seed: u64,
        run_tag: &str,
        target: &Target,
        races: bool,
    ) -> anyhow::Result<Self> {
        let conns = match target {
            Target::Service { addr, api_key } => {
                let count = if races { 2 } else { 1 };
                (0..count)
                    .map(|_| Conn::new(*addr, api_key))
                    .collect::<anyhow::Result<_>>()?
            }
            Target::Store(_) | Target::Floor(_) => Vec::new(),
        };
        Ok(Self {
            id,
            rng: SplitMix64(seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            seq: 0,
            owner: ObjectId::new(),
            run_tag: run_tag.to_owned(),
            completed: Vec::new(),
            conns,
            times: OpTimes::default(),
        })
    }

    fn new_payment(&mut self, quantity: u32) -> Payment {
        self.seq += 1;
        Payment {
            provider: "stripe",
            account_id: "acct_bench",
            payment_intent_id: format!("pi_{}_{}_{}", self.run_tag, self.id, self.seq),
            owner: self.owner,
            token_type: "standard",
            quantity,
            date: DateTime::now(),
        }
    }

    fn remember(&mut self, payment: Payment) {
        if self.completed.len() < COMPLETED_KEPT {
            self.completed.push(payment);
        } else {
            let slot = (self.rng.next() % COMPLETED_KEPT as u64) as usize;
            self.completed[slot] = payment;
        }
    }
}

/// What a segment measured.
pub struct Stats {
    pub latency: Histogram<u64>,
    pub by_status: BTreeMap<u16, u64>,
    pub ok: u64,
    pub created: u64,
    pub races: u64,
    pub first_error: Option<String>,
    pub op_times: OpTimes,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency: new_histogram(),
            by_status: BTreeMap::new(),
            ok: 0,
            created: 0,
            races: 0,
            first_error: None,
            op_times: OpTimes::default(),
        }
    }
}

impl Stats {
    fn record(&mut self, outcome: Outcome, latency: Duration) {
        let _ = self.latency.record(micros(latency));
        *self.by_status.entry(outcome.status).or_default() += 1;
        if (200..300).contains(&outcome.status) {
            self.ok += 1;
        }
        self.created += u64::from(outcome.created);
        if self.first_error.is_none() {
            self.first_error = outcome.error;
        }
    }

    pub fn add(&mut self, other: &Stats) {
        let _ = self.latency.add(&other.latency);
        for (status, count) in &other.by_status {
            *self.by_status.entry(*status).or_default() += count;
        }
        self.ok += other.ok;
        self.created += other.created;
        self.races += other.races;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.op_times.add(&other.op_times);
    }
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs to 10 min at 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// Runs every client against `target` until `deadline`; returns the clients (for the
/// next segment) and the merged stats.
pub async fn run_segment(
    clients: Vec<Client>,
    target: &Target,
    workload: Workload,
    deadline: Instant,
) -> (Vec<Client>, Stats) {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let target = target.clone();
            tokio::spawn(client_loop(client, target, workload, deadline))
        })
        .collect();
    let mut clients = Vec::with_capacity(tasks.len());
    let mut total = Stats::default();
    for task in tasks {
        let (mut client, stats) = task.await.expect("client task panicked");
        total.add(&stats);
        client.times = OpTimes::default();
        clients.push(client);
    }
    (clients, total)
}

async fn client_loop(
    mut client: Client,
    target: Target,
    workload: Workload,
    deadline: Instant,
) -> (Client, Stats) {
    let mut stats = Stats::default();
    while Instant::now() < deadline {
        let draw = client.rng.unit();
        if draw < workload.replays && !client.completed.is_empty() {
            let pick = (client.rng.next() % client.completed.len() as u64) as usize;
            let payment = client.completed[pick].clone();
            let (outcome, latency) = issue(&mut client, 0, &target, &payment, workload.mode).await;
            stats.record(outcome, latency);
            continue;
        }
        let payment = client.new_payment(workload.quantity);
        let race = client.rng.unit() < workload.races;
        let ok = if race {
            stats.races += 1;
            let (a, b) = race_twice(&mut client, &target, &payment, workload.mode).await;
            let ok = (200..300).contains(&a.0.status) && (200..300).contains(&b.0.status);
            stats.record(a.0, a.1);
            stats.record(b.0, b.1);
            ok
        } else {
            let (outcome, latency) = issue(&mut client, 0, &target, &payment, workload.mode).await;
            let ok = (200..300).contains(&outcome.status);
            stats.record(outcome, latency);
            ok
        };
        if ok {
            client.remember(payment);
        }
    }
    std::mem::swap(&mut stats.op_times, &mut client.times);
    (client, stats)
}

/// One request on connection `conn` (service), or in-process (store, floors).
async fn issue(
    client: &mut Client,
    conn: usize,
    target: &Target,
    payment: &Payment,
    mode: IssuanceMode,
) -> (Outcome, Duration) {
    let started = Instant::now();
    let outcome = match target {
        Target::Service { .. } => post(&mut client.conns[conn], payment, mode).await,
        Target::Store(store) => store_issue(store, payment, mode).await,
        Target::Floor(floor) => floor.issue(payment, mode, &mut client.times).await,
    };
    (outcome, started.elapsed())
}

/// The same new payment twice at once.
async fn race_twice(
    client: &mut Client,
    target: &Target,
    payment: &Payment,
    mode: IssuanceMode,
) -> ((Outcome, Duration), (Outcome, Duration)) {
    match target {
        Target::Service { .. } => {
            let [first, second] = client
                .conns
                .get_disjoint_mut([0, 1])
                .expect("two connections for races");
            tokio::join!(
                timed_post(first, payment, mode),
                timed_post(second, payment, mode)
            )
        }
        Target::Store(store) => tokio::join!(
            timed_store(store, payment, mode),
            timed_store(store, payment, mode)
        ),
        Target::Floor(floor) => {
            let mut other_times = OpTimes::default();
            let result = tokio::join!(
                timed_floor(floor, payment, mode, &mut client.times),
                timed_floor(floor, payment, mode, &mut other_times)
            );
            client.times.add(&other_times);
            result
        }
    }
}

async fn timed_post(conn: &mut Conn, payment: &Payment, mode: IssuanceMode) -> (Outcome, Duration) {
    let started = Instant::now();
    (post(conn, payment, mode).await, started.elapsed())
}

async fn timed_store(store: &Issuer, payment: &Payment, mode: IssuanceMode) -> (Outcome, Duration) {
    let started = Instant::now();
    (store_issue(store, payment, mode).await, started.elapsed())
}

/// `Issuer::issue` with the request the HTTP handler would have validated.
async fn store_issue(store: &Issuer, payment: &Payment, mode: IssuanceMode) -> Outcome {
    let request = match new_issuance(payment, mode) {
        Ok(request) => request,
        Err(message) => return Outcome::error(422, message),
    };
    match store.issue(Caller::Trusted, &request).await {
        Ok(IssueOutcome::Created(issued)) => Outcome::ok(201, issued.created),
        Ok(IssueOutcome::Replayed(issued)) => Outcome::ok(200, issued.created),
        Ok(IssueOutcome::Pending(issued)) => Outcome::ok(202, issued.created),
        Err(IssueError::Conflict(_)) => Outcome::ok(409, 0),
        Err(err) => Outcome::error(500, err.to_string()),
    }
}

/// The validated request for `payment`: what the in-process store is asked to issue, and
/// what the floors build their documents from with the store's own builders.
pub fn new_issuance(payment: &Payment, mode: IssuanceMode) -> Result<NewIssuance, String> {
    Ok(NewIssuance {
        key: PaymentKey {
            provider: Provider::parse(payment.provider)?,
            account_id: AccountId::parse(payment.account_id)?,
            payment_intent_id: PaymentIntentId::parse(&payment.payment_intent_id)?,
        },
        params: IssuanceParams {
            owner: Owner::from_object_id(payment.owner),
            token_type: TokenType::parse(payment.token_type)?,
            quantity: Quantity::from_i64(i64::from(payment.quantity), u32::MAX)?,
        },
        payment_date: tokenmint::store::chrono_time(payment.date),
        mode,
        requested_by: Actor::api_key("bench"),
    })
}

async fn timed_floor(
    floor: &Floor,
    payment: &Payment,
    mode: IssuanceMode,
    times: &mut OpTimes,
) -> (Outcome, Duration) {
    let started = Instant::now();
    (floor.issue(payment, mode, times).await, started.elapsed())
}

async fn post(conn: &mut Conn, payment: &Payment, mode: IssuanceMode) -> Outcome {
    match conn.post_json("/v1/issuances", payment.json(mode)).await {
        Ok(reply) => Outcome {
            status: reply.status,
            created: created_field(&reply.body).unwrap_or(0),
            error: (reply.status >= 400).then(|| String::from_utf8_lossy(&reply.body).into_owned()),
        },
        Err(err) => Outcome::error(599, format!("transport: {err:#}")),
    }
}

/// The `created` count of an issuance answer: its last field, found from the end
/// without parsing the whole JSON.
fn created_field(body: &[u8]) -> Option<u32> {
    const KEY: &[u8] = b"\"created\":";
    let at = body.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit());
    Some(digits.fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
}

/// A small, fast, seeded generator: the same seed gives every target the same mix.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_created_from_the_end() {
        assert_eq!(created_field(br#"{"tokens":[],"created":4}"#), Some(4));
        assert_eq!(created_field(br#"{"created":12}"#), Some(12));
        assert_eq!(created_field(br#"{"tokens":[]}"#), None);
    }

    #[test]
    fn unit_draws_are_in_range() {
        let mut rng = SplitMix64(7);
        assert!(
            (0..1000)
                .map(|_| rng.unit())
                .all(|u| (0.0..1.0).contains(&u))
        );
    }
}
