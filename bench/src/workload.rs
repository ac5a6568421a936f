//! The closed loop: N virtual clients, each sending one request at a time until the
//! deadline, against the service (HTTP), its store in-process, or one of the floors
//! (database operations issued directly). What each client sends — new payments, replays
//! of its completed payments, concurrent duplicate races — is drawn from the same seeded
//! generator for every target, so all see the same mix. How one request reaches each kind
//! of target is `request`.
//!
//! The redemption workload (`Operation::Redeem`, the service only) has each client spend
//! its own owner's tokens with `POST /v1/redemptions`, new references or retries of its
//! completed ones. The tokens are issued to the client beforehand (`stock_up`, not
//! measured), so that the measured window times redemptions alone.

mod request;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mongodb::bson::{DateTime, oid::ObjectId};
use tokenmint::domain::IssuanceMode;
use tokenmint::issuing::Issuer;

use crate::floor::Floor;
use crate::http::Conn;
use crate::op_times::OpTimes;
pub use request::new_issuance;
use request::{issue, race_twice, redeem};

/// What a scenario's clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/issuances`: new payments, replays, races.
    Issue,
    /// `POST /v1/redemptions` of the client's own tokens: new references and retries.
    Redeem,
}

/// What one scenario sends.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Issuances or redemptions.
    pub operation: Operation,
    pub concurrency: usize,
    /// Tokens per payment, or per redemption.
    pub quantity: u32,
    /// The issuance mode (of the stock too, in a redemption workload).
    pub mode: IssuanceMode,
    /// Fraction of requests that repeat one of the client's completed requests: a replay
    /// of an issued payment, or a redemption retried with its reference.
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

    /// A 2xx answer: the payment is issued (created, replayed or pending).
    fn succeeded(&self) -> bool {
        (200..300).contains(&self.status)
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
    /// Active tokens of `owner` not yet redeemed (redemption workload).
    balance: u64,
    /// Numbers of the redemptions this client completed; `reference` names them.
    redeemed: Vec<u64>,
    redemption_seq: u64,
    /// New redemptions per second in the client's last segment, to size the next stock.
    redemption_rate: f64,
}

const COMPLETED_KEPT: usize = 4096;

/// The account of every payment the bench issues, and so of every token it redeems.
const ACCOUNT_ID: &str = "acct_bench";
/// The token type of every payment the bench issues.
const TOKEN_TYPE: &str = "standard";

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
            balance: 0,
            redeemed: Vec::new(),
            redemption_seq: 0,
            redemption_rate: 0.0,
        })
    }

    /// The reference of redemption number `seq`: unique per run, scenario and client.
    fn reference(&self, seq: u64) -> String {
        format!("rd_{}_{}_{seq}", self.run_tag, self.id)
    }

    /// Issues payments to this client's owner until it holds `tokens` (not timed).
    async fn stock_up(&mut self, target: &Target, tokens: u64, mode: IssuanceMode) -> Stats {
        let mut stats = Stats::default();
        while self.balance < tokens {
            let quantity = (tokens - self.balance).min(u64::from(max_quantity())) as u32;
            let payment = self.new_payment(quantity);
            let (outcome, latency) = issue(self, target, &payment, mode).await;
            let failed = outcome.status != 201;
            self.balance += u64::from(outcome.created);
            stats.record(outcome, latency);
            if failed {
                // A stock that cannot be issued would loop for ever; the redemptions then
                // answer insufficient_balance, and the first error says why.
                break;
            }
        }
        stats
    }

    fn new_payment(&mut self, quantity: u32) -> Payment {
        self.seq += 1;
        Payment {
            provider: "stripe",
            account_id: ACCOUNT_ID,
            payment_intent_id: format!("pi_{}_{}_{}", self.run_tag, self.id, self.seq),
            owner: self.owner,
            token_type: TOKEN_TYPE,
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
    /// Tokens created (issuances) or redeemed (redemptions).
    pub created: u64,
    pub races: u64,
    /// Stocks a client ran out of in the window and issued again (redemption workload):
    /// each one's time is in the window but not in the latencies.
    pub refills: u64,
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
            refills: 0,
            first_error: None,
            op_times: OpTimes::default(),
        }
    }
}

impl Stats {
    fn record(&mut self, outcome: Outcome, latency: Duration) {
        let _ = self.latency.record(micros(latency));
        *self.by_status.entry(outcome.status).or_default() += 1;
        if outcome.succeeded() {
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
        self.refills += other.refills;
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
            let segment = Segment {
                target: target.clone(),
                workload,
                deadline,
            };
            tokio::spawn(client_loop(client, segment))
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

/// The service's default `issuance.max_quantity`: the largest stock payment (the bench
/// starts the service with its defaults).
fn max_quantity() -> u32 {
    static MAX: LazyLock<u32> = LazyLock::new(|| {
        tokenmint::settings::Settings::with_overrides(&[])
            .map_or(1, |settings| settings.issuance.max_quantity)
    });
    *MAX
}

/// New redemptions per second the first segment's stock is sized for, shared by all
/// clients; later segments use what each client measured. A guess above what the 2-core
/// machine does, so that the warm-up rarely refills.
const FIRST_GUESS_PER_SECOND: f64 = 800.0;

/// Before a segment of `duration` (redemption workload): each client is issued, unmeasured,
/// the tokens it will redeem — its last segment's rate with half again as margin.
pub async fn stock_up(
    clients: &mut Vec<Client>,
    target: &Target,
    workload: Workload,
    duration: Duration,
) -> Stats {
    let tasks: Vec<_> = std::mem::take(clients)
        .into_iter()
        .map(|mut client| {
            let target = target.clone();
            let tokens = stock_for(&client, workload, duration);
            tokio::spawn(async move {
                let stats = client.stock_up(&target, tokens, workload.mode).await;
                (client, stats)
            })
        })
        .collect();
    let mut total = Stats::default();
    for task in tasks {
        let (client, stats) = task.await.expect("stock task panicked");
        total.add(&stats);
        clients.push(client);
    }
    total
}

/// Tokens `client` should hold for a segment of `duration`.
fn stock_for(client: &Client, workload: Workload, duration: Duration) -> u64 {
    let rate = if client.redemption_rate > 0.0 {
        client.redemption_rate
    } else {
        FIRST_GUESS_PER_SECOND / workload.concurrency as f64
    };
    let redemptions = (1.5 * rate * duration.as_secs_f64()).ceil() as u64 + 1;
    redemptions * u64::from(workload.quantity)
}

/// What one client runs in a segment: the workload against `target` until `deadline`.
struct Segment {
    target: Target,
    workload: Workload,
    deadline: Instant,
}

async fn client_loop(client: Client, segment: Segment) -> (Client, Stats) {
    match segment.workload.operation {
        Operation::Issue => issue_loop(client, segment).await,
        Operation::Redeem => redeem_loop(client, segment).await,
    }
}

/// Issuances until the deadline: a replay of one of the client's completed payments with
/// probability `replays`, else a new payment, sent twice at once with probability `races`.
async fn issue_loop(mut client: Client, segment: Segment) -> (Client, Stats) {
    let (target, workload) = (&segment.target, segment.workload);
    let mut stats = Stats::default();
    while Instant::now() < segment.deadline {
        let draw = client.rng.unit();
        if draw < workload.replays && !client.completed.is_empty() {
            let pick = (client.rng.next() % client.completed.len() as u64) as usize;
            let payment = client.completed[pick].clone();
            let (outcome, latency) = issue(&mut client, target, &payment, workload.mode).await;
            stats.record(outcome, latency);
            continue;
        }
        let payment = client.new_payment(workload.quantity);
        let race = client.rng.unit() < workload.races;
        let ok = if race {
            stats.races += 1;
            let (a, b) = race_twice(&mut client, target, &payment, workload.mode).await;
            let ok = a.0.succeeded() && b.0.succeeded();
            stats.record(a.0, a.1);
            stats.record(b.0, b.1);
            ok
        } else {
            let (outcome, latency) = issue(&mut client, target, &payment, workload.mode).await;
            let ok = outcome.succeeded();
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

/// Redemptions of `workload.quantity` of the client's tokens until `deadline`: a retry of
/// one of its completed references with probability `replays` (answered 200, nothing
/// redeemed), else a new reference (201).
async fn redeem_loop(mut client: Client, segment: Segment) -> (Client, Stats) {
    let (target, workload) = (&segment.target, segment.workload);
    let mut stats = Stats::default();
    let quantity = workload.quantity;
    let started = Instant::now();
    let mut new_redemptions = 0u64;
    while Instant::now() < segment.deadline {
        let draw = client.rng.unit();
        if draw < workload.replays && !client.redeemed.is_empty() {
            let pick = (client.rng.next() % client.redeemed.len() as u64) as usize;
            let seq = client.redeemed[pick];
            let (outcome, latency) = redeem(&mut client, target, seq, quantity).await;
            stats.record(outcome, latency);
            continue;
        }
        if client.balance < u64::from(quantity) {
            // The stock ran out: issue another, outside the latencies; counted so that a
            // report with refills can be read for what it is.
            stats.refills += 1;
            let tokens = u64::from(quantity) * 100;
            let refill = client.stock_up(target, tokens, workload.mode).await;
            if refill.first_error.is_some() && stats.first_error.is_none() {
                stats.first_error = refill.first_error;
            }
        }
        client.redemption_seq += 1;
        let seq = client.redemption_seq;
        let (outcome, latency) = redeem(&mut client, target, seq, quantity).await;
        if outcome.status == 201 {
            // Saturating: a stock payment that timed out after its commit holds tokens
            // the balance never counted.
            client.balance = client.balance.saturating_sub(u64::from(quantity));
            new_redemptions += 1;
            if client.redeemed.len() < COMPLETED_KEPT {
                client.redeemed.push(seq);
            } else {
                let slot = (client.rng.next() % COMPLETED_KEPT as u64) as usize;
                client.redeemed[slot] = seq;
            }
        }
        stats.record(outcome, latency);
    }
    client.redemption_rate = new_redemptions as f64 / started.elapsed().as_secs_f64().max(1e-9);
    (client, stats)
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
    fn unit_draws_are_in_range() {
        let mut rng = SplitMix64(7);
        assert!(
            (0..1000)
                .map(|_| rng.unit())
                .all(|u| (0.0..1.0).contains(&u))
        );
    }
}
