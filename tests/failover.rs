//! Failover fault injection (issue 6): a 3-member replica set of the pinned mongod on
//! loopback (member 0 has priority 2), tokenmint in-process against it, concurrent
//! issuance load (8 clients, quantity 4, both modes, new payments, concurrent twins and
//! replays), and during the load a change of primary:
//! - stepdown: `replSetStepDown` (forced) on the primary; 10 s later member 0 takes over
//!   again (priority takeover): two elections under load;
//! - kill-primary: SIGKILL of the primary's mongod, restarted 6 s later (it rejoins, rolls
//!   back whatever was not majority-committed, and takes over again);
//! - replication-lag: both secondaries paused (SIGSTOP) so a first request's write is
//!   applied on the primary only, an identical second request meanwhile, then the primary
//!   is killed and the secondaries resume: the second request must not have been answered
//!   2xx with tokens the failover then lost.
//!
//! Clients retry 5xx and connection errors for the same payment until 2xx. Afterwards every
//! acknowledged issuance must be in the database (read with majority read concern) with
//! exactly the acknowledged token ids, every answer for a payment must name the same ids,
//! and `Store::verify()` must be clean. Printed: the error rate (non-2xx / all answers) and,
//! per election, how long there was no primary and no successful write.
//!
//! Ignored by default (slow); run with `scripts/reliability.sh`, or:
//!
//!     cargo test --test failover -- --ignored --nocapture
//!
//! `TOKENMINT_FAILOVER_SEED` replays the clients' choices (the seed is printed);
//! `TOKENMINT_FAILOVER_KEEP=1` keeps the members' data and logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use futures::future::join_all;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{ClientOptions, CollectionOptions, ReadConcern};
use mongodb::{Client, Collection};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokenmint::embedded::die_with_parent;
use tokenmint::http::auth::key_hash;
use tokenmint::settings::Settings;
use tokenmint::startup::Application;
use tokenmint::store::{Store, StoreConfig, VerifyReport};
use tokio::task::JoinHandle;

const KEY: &str = "failover-test-key";
const OWNER: &str = "65f1a0c2b3d4e5f601234567";
const REPLICA_SET: &str = "rs0";
const CLIENTS: usize = 8;
const QUANTITY: i64 = 4;
/// Load before the fault, and at least this long after it.
const BEFORE_FAULT: Duration = Duration::from_secs(3);
const AFTER_FAULT: Duration = Duration::from_secs(15);
/// Scenario B restarts the killed member this long after the kill.
const RESTART_AFTER: Duration = Duration::from_secs(6);
/// The load also waits (at most this long after the fault) for member 0 to be primary
/// again, so the priority takeover happens under load, not during the checks.
const TAKEOVER_WAIT: Duration = Duration::from_secs(45);
/// How long one payment may be retried before the test calls it lost.
const RETRY_DEADLINE: Duration = Duration::from_secs(90);

/// The token ids of one answer, as (tokenIndex, id) in tokenIndex order.
type TokenIds = Vec<(i64, String)>;

/// Serializes the scenarios: each runs three mongods, and the machine may be small.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------
// The replica set.

struct Member {
    port: u16,
    dbpath: PathBuf,
    child: Option<Child>,
    /// A direct connection (no discovery) for probing this member.
    client: Client,
}

/// Three mongods on loopback with temporary data; all SIGKILLed and reaped on drop.
struct ReplicaSet {
    binary: PathBuf,
    members: Vec<Member>,
    dir: Option<tempfile::TempDir>,
}

fn mongod_binary() -> PathBuf {
    let binary = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/mongodb/bin/mongod");
    assert!(
        binary.is_file(),
        "{} is missing: run scripts/install-mongod.sh",
        binary.display()
    );
    binary
}

fn free_ports(n: usize) -> Vec<u16> {
    // Held together so they are distinct; released just before mongod binds them.
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A direct client to one member, failing fast (a probe must not hang on a dead member).
async fn direct_client(port: u16) -> Client {
    let mut options =
        ClientOptions::parse(format!("mongodb://127.0.0.1:{port}/?directConnection=true"))
            .await
            .unwrap();
    options.server_selection_timeout = Some(Duration::from_millis(500));
    options.connect_timeout = Some(Duration::from_millis(500));
    Client::with_options(options).unwrap()
}

/// Index of the member that says it is the writable primary, asking all at once.
async fn probe_primary(clients: &[Client]) -> Option<usize> {
    let answers = join_all(clients.iter().map(|client| async move {
        client
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
            .ok()
            .is_some_and(|hello| hello.get_bool("isWritablePrimary").unwrap_or(false))
    }))
    .await;
    answers.iter().position(|primary| *primary)
}

impl ReplicaSet {
    async fn start() -> ReplicaSet {
        let dir = tempfile::tempdir().unwrap();
        let mut members = Vec::new();
        for (i, port) in free_ports(3).into_iter().enumerate() {
            let dbpath = dir.path().join(format!("m{i}"));
            std::fs::create_dir_all(&dbpath).unwrap();
            members.push(Member {
                port,
                dbpath,
                child: None,
                client: direct_client(port).await,
            });
        }
        let mut set = ReplicaSet {
            binary: mongod_binary(),
            members,
            dir: Some(dir),
        };
        for i in 0..3 {
            set.spawn(i);
        }
        set.initiate().await;
        set
    }

    fn spawn(&mut self, i: usize) {
        let member = &mut self.members[i];
        let mut command = Command::new(&self.binary);
        command
            .args(["--replSet", REPLICA_SET, "--bind_ip", "127.0.0.1", "--port"])
            .arg(member.port.to_string())
            .arg("--dbpath")
            .arg(&member.dbpath)
            .arg("--logpath")
            .arg(member.dbpath.join("mongod.log"))
            .arg("--logappend")
            .args(["--setParameter", "diagnosticDataCollectionEnabled=false"])
            .args(["--wiredTigerCacheSizeGB", "0.25", "--oplogSize", "256"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SIGKILL if the test process dies first.
        die_with_parent(&mut command, libc::SIGKILL);
        member.child = Some(command.spawn().expect("mongod starts"));
    }

    fn uri(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("mongodb://{}/?replicaSet={REPLICA_SET}", hosts.join(","))
    }

    fn clients(&self) -> Vec<Client> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// Member 0 has priority 2 so it is elected first (and takes over again when it can).
    /// It is asked to step up at once instead of waiting out the 10 s election timeout.
    async fn initiate(&self) {
        let members: Vec<Bson> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Bson::Document(doc! {
                    "_id": i as i32,
                    "host": format!("127.0.0.1:{}", m.port),
                    "priority": if i == 0 { 2 } else { 1 },
                })
            })
            .collect();
        let config = doc! { "_id": REPLICA_SET, "members": members };
        let admin = self.members[0].client.database("admin");
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(err) = admin
            .run_command(doc! { "replSetInitiate": config.clone() })
            .await
        {
            assert!(Instant::now() < deadline, "replSetInitiate: {err}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        while self.primary().await.is_none() {
            assert!(
                Instant::now() < deadline,
                "no primary after replSetInitiate"
            );
            let _ = admin.run_command(doc! { "replSetStepUp": 1 }).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.wait_until_healthy(Duration::from_secs(90)).await;
    }

    async fn primary(&self) -> Option<usize> {
        probe_primary(&self.clients()).await
    }

    /// Waits for a primary and for every running member to be PRIMARY or SECONDARY.
    async fn wait_until_healthy(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(primary) = self.primary().await {
                let status = self.members[primary]
                    .client
                    .database("admin")
                    .run_command(doc! { "replSetGetStatus": 1 })
                    .await;
                let running = self.members.iter().filter(|m| m.child.is_some()).count();
                let healthy = status
                    .ok()
                    .and_then(|s| s.get_array("members").ok().cloned())
                    .map(|members| {
                        members
                            .iter()
                            .filter_map(Bson::as_document)
                            .filter(|m| matches!(m.get_i32("state"), Ok(1) | Ok(2)))
                            .count()
                    });
                if healthy == Some(running) {
                    return primary;
                }
            }
            assert!(
                Instant::now() < deadline,
                "replica set not healthy within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `replSetStepDown` (forced) on member `i`. The server may close the connection
    /// while stepping down, so the answer is not checked; the timeline shows the result.
    async fn step_down(&self, i: usize) {
        let _ = self.members[i]
            .client
            .database("admin")
            .run_command(doc! { "replSetStepDown": 10, "force": true })
            .await;
    }

    /// SIGSTOP / SIGCONT member `i`: a paused member is a member that stopped replicating.
    fn signal(&self, i: usize, signal: i32) {
        let child = self.members[i].child.as_ref().expect("member running");
        // SAFETY: signalling a child process we started and have not reaped yet.
        let rc = unsafe { libc::kill(child.id() as i32, signal) };
        assert_eq!(rc, 0, "signal {signal} to mongod {i}");
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            // SAFETY: signalling a child process we started and have not reaped yet.
            let rc = unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            assert_eq!(rc, 0, "kill mongod {i}");
            child.wait().unwrap();
        }
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::env::var_os("TOKENMINT_FAILOVER_KEEP").is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("replica set data and logs kept in {}", dir.keep().display());
        }
    }
}

/// Samples which member is primary every 200 ms until `stop`.
async fn watch_primary(
    clients: Vec<Client>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<(Duration, Option<usize>)> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        samples.push((start.elapsed(), probe_primary(&clients).await));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    samples
}

/// An election seen by the watcher (a change of primary, or a stretch without one): from
/// whom, to whom, the last sample that still showed the old primary and the first that
/// showed the new one.
#[derive(Debug)]
struct Election {
    from: usize,
    to: usize,
    lost: Duration,
    elected: Duration,
}

fn elections(samples: &[(Duration, Option<usize>)]) -> Vec<Election> {
    let mut found = Vec::new();
    // The primary last seen and when; whether a sample since showed no primary at all.
    let mut current: Option<(usize, Duration)> = None;
    let mut without_primary = false;
    for &(at, primary) in samples {
        match primary {
            None => without_primary = current.is_some(),
            Some(to) => {
                if let Some((from, lost)) = current
                    && (without_primary || from != to)
                {
                    // Re-electing the same member (after its stepdown freeze) counts too.
                    found.push(Election {
                        from,
                        to,
                        lost,
                        elected: at,
                    });
                }
                current = Some((to, at));
                without_primary = false;
            }
        }
    }
    found
}

/// The longest stretch without a successful write that overlaps `[from, to]`.
fn longest_gap_over(
    successes: &[Duration],
    from: Duration,
    to: Duration,
    end: Duration,
) -> Duration {
    let mut previous = successes
        .iter()
        .rev()
        .find(|s| **s <= from)
        .copied()
        .unwrap_or(from);
    let mut longest = Duration::ZERO;
    for next in successes.iter().copied().filter(|s| *s > from).chain([end]) {
        if previous > to {
            break;
        }
        longest = longest.max(next - previous);
        previous = next;
    }
    longest
}

// ---------------------------------------------------------------------------------------
// The load.

/// One answer the service gave (or a connection failure), with when it came.
#[derive(Debug, Clone)]
struct Attempt {
    at: Duration,
    ok: bool,
    status: u16,
}

/// Everything the clients saw.
#[derive(Debug, Default)]
struct Observed {
    attempts: Vec<Attempt>,
    /// Acknowledged answers: (payment, ids).
    acknowledged: Vec<(String, TokenIds)>,
    violations: Vec<String>,
}

impl Observed {
    fn merge(&mut self, other: Observed) {
        self.attempts.extend(other.attempts);
        self.acknowledged.extend(other.acknowledged);
        self.violations.extend(other.violations);
    }
}

fn token_ids(body: &Value) -> TokenIds {
    body["tokens"]
        .as_array()
        .map(|tokens| {
            tokens
                .iter()
                .map(|t| {
                    (
                        t["tokenIndex"].as_i64().unwrap_or(-1),
                        t["id"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn issuance_body(payment: &str, mode: &str) -> Value {
    json!({
        "provider": "stripe",
        "accountId": "acct_failover",
        "paymentIntentId": payment,
        "owner": OWNER,
        "tokenType": "standard",
        "quantity": QUANTITY,
        "mode": mode,
    })
}

/// Sends `body` until it is answered 2xx (retrying 5xx and connection errors after a
/// short pause) or the deadline passes.
async fn issue_until_ok(
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
            .bearer_auth(KEY)
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
            let ids = token_ids(answer.as_ref().unwrap());
            let full = ids.len() == QUANTITY as usize
                && ids
                    .iter()
                    .enumerate()
                    .all(|(i, (index, _))| *index == i as i64);
            if !full {
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
async fn client(
    id: usize,
    seed: u64,
    base: String,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Observed {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(id as u64));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut observed = Observed::default();
    let mut mine: Vec<(String, String)> = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        if !mine.is_empty() && rng.random_bool(0.2) {
            let (payment, mode) = mine[rng.random_range(0..mine.len())].clone();
            let body = issuance_body(&payment, &mode);
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
        let body = issuance_body(&payment, mode);
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

// ---------------------------------------------------------------------------------------
// The scenarios.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    StepDown,
    KillPrimary,
}

/// The service, in-process, against the replica set: its base URL and a stop handle.
async fn start_app(set: &ReplicaSet, database: &str) -> (String, AppStop, JoinHandle<()>) {
    let config = format!(
        "[server]\nbind = \"127.0.0.1:0\"\n[rate_limit]\nper_key_per_second = 100000\nburst = 100000\n[mongo]\nuri = \"{}\"\ndatabase = \"{database}\"\nserver_selection_timeout_ms = 5000\n[log]\nlevel = \"warn\"\n[[auth.keys]]\nid = \"failover\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
        set.uri(),
        key_hash(KEY)
    );
    let settings = Settings::with_overrides(&[&config]).expect("settings");
    // Failures only (503 warnings, 500 errors), so the cause of every non-2xx is visible.
    tokenmint::telemetry::init_logging(&settings.log);
    let app = Application::build(&settings).await.expect("app builds");
    let base = format!("http://{}", app.local_addr());
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let _ = app
            .run_until_stopped(async move {
                let _ = stop_rx.await;
            })
            .await;
    });
    (base, AppStop(stop), server)
}

struct AppStop(tokio::sync::oneshot::Sender<()>);

impl AppStop {
    async fn stop(self, server: JoinHandle<()>) {
        let _ = self.0.send(());
        let _ = server.await;
    }
}

async fn failover_scenario(fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    let name = match fault {
        Fault::StepDown => "stepdown",
        Fault::KillPrimary => "kill-primary",
    };
    let seed = std::env::var("TOKENMINT_FAILOVER_SEED")
        .ok()
        .map(|v| v.parse().expect("TOKENMINT_FAILOVER_SEED is a u64"))
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("failover[{name}]: seed {seed}; starting a 3-member replica set");
    let mut set = ReplicaSet::start().await;
    let first_primary = set.wait_until_healthy(Duration::from_secs(60)).await;

    let database = "tokenmint_failover";
    let (base, stop_app, server) = start_app(&set, database).await;

    // Load, the fault, more load.
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch_primary(set.clients(), start, stop_watch.clone()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, seed, base.clone(), start, stop.clone())))
        .collect();
    tokio::time::sleep(BEFORE_FAULT).await;
    let fault_at = start.elapsed();
    match fault {
        Fault::StepDown => set.step_down(first_primary).await,
        Fault::KillPrimary => set.kill(first_primary),
    }
    eprintln!("failover[{name}]: fault injected on member {first_primary} at {fault_at:?}");
    let mut restarted_at = None;
    loop {
        let since = start.elapsed() - fault_at;
        if fault == Fault::KillPrimary && restarted_at.is_none() && since >= RESTART_AFTER {
            set.spawn(first_primary);
            restarted_at = Some(start.elapsed());
            eprintln!(
                "failover[{name}]: member {first_primary} restarted at {:?}",
                start.elapsed()
            );
        }
        if since >= AFTER_FAULT
            && (set.primary().await == Some(first_primary) || since >= TAKEOVER_WAIT)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut observed = Observed::default();
    for client in join_all(clients).await {
        observed.merge(client.expect("client task"));
    }
    let load_time = start.elapsed();
    stop_watch.store(true, Ordering::Relaxed);
    let timeline = watcher.await.expect("watcher task");
    stop_app.stop(server).await;

    // The checks, with a primary elected again.
    set.wait_until_healthy(Duration::from_secs(90)).await;
    let mut violations = std::mem::take(&mut observed.violations);
    let stored = stored_tokens(&set.uri(), database).await;
    let mut by_payment: BTreeMap<&str, &TokenIds> = BTreeMap::new();
    for (payment, ids) in &observed.acknowledged {
        match by_payment.get(payment.as_str()) {
            Some(first) if *first != ids => violations.push(format!(
                "{payment}: two acknowledgments name different tokens: {first:?} vs {ids:?}"
            )),
            Some(_) => {}
            None => {
                by_payment.insert(payment, ids);
            }
        }
    }
    for (payment, ids) in &by_payment {
        let in_db = stored.get(*payment);
        if in_db != Some(*ids) {
            violations.push(format!(
                "{payment}: acknowledged {ids:?}, stored {in_db:?} (lost or replaced)"
            ));
        }
    }
    let report = verify(&set.uri(), database, &mut violations).await;
    if report.issuances_checked != by_payment.len() as u64 {
        violations.push(format!(
            "{} issuance records but {} acknowledged payments",
            report.issuances_checked,
            by_payment.len()
        ));
    }

    // The figures.
    let total = observed.attempts.len();
    let failed: Vec<&Attempt> = observed.attempts.iter().filter(|a| !a.ok).collect();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for attempt in &failed {
        *statuses.entry(attempt.status).or_default() += 1;
    }
    let mut successes: Vec<Duration> = observed
        .attempts
        .iter()
        .filter(|a| a.ok)
        .map(|a| a.at)
        .collect();
    successes.sort();
    let longest_gap = successes
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let elections = elections(&timeline);
    let described: Vec<String> = elections
        .iter()
        .map(|e| {
            format!(
                "{}->{} at {:.1}s: no primary {}ms, no successful write {}ms",
                e.from,
                e.to,
                e.lost.as_secs_f64(),
                (e.elected - e.lost).as_millis(),
                longest_gap_over(&successes, e.lost, e.elected, load_time).as_millis()
            )
        })
        .collect();
    eprintln!(
        "failover[{name}] summary: seed={seed} load_s={:.1} fault_at_s={:.1}{} answers={total} acknowledged={} payments={} tokens={} non_2xx={} error_rate={:.2}% statuses={statuses:?} elections={} [{}] longest_no_write_window_ms={} violations={}",
        load_time.as_secs_f64(),
        fault_at.as_secs_f64(),
        restarted_at
            .map(|r| format!(" restarted_at_s={:.1}", r.as_secs_f64()))
            .unwrap_or_default(),
        observed.acknowledged.len(),
        by_payment.len(),
        report.tokens_checked,
        failed.len(),
        100.0 * failed.len() as f64 / total.max(1) as f64,
        elections.len(),
        described.join("; "),
        longest_gap.as_millis(),
        violations.len(),
    );
    assert!(
        violations.is_empty(),
        "failover[{name}] seed {seed}: {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
    assert!(
        elections.iter().any(|e| e.from == first_primary),
        "the fault caused no election: {timeline:?}"
    );
    assert!(
        !by_payment.is_empty(),
        "no issuance was acknowledged at all"
    );
}

/// `tokenmint verify` on `database`: any finding is a violation. Returns the report for
/// the caller's own counts.
async fn verify(uri: &str, database: &str, violations: &mut Vec<String>) -> VerifyReport {
    let store = Store::connect(
        uri,
        database,
        Duration::from_secs(10),
        4,
        StoreConfig::default(),
    )
    .await
    .unwrap();
    let report = store.verify().await.expect("verify");
    if !report.is_clean() {
        violations.push(format!("verify:\n{report}"));
    }
    report
}

/// Every stored token, by payment, as (tokenIndex, id) in tokenIndex order; read with
/// majority read concern, so nothing that a later rollback could remove counts.
async fn stored_tokens(uri: &str, database: &str) -> BTreeMap<String, TokenIds> {
    let client = Client::with_uri_str(uri).await.unwrap();
    let tokens: Collection<Document> = client.database(database).collection_with_options(
        "tokens",
        CollectionOptions::builder()
            .read_concern(ReadConcern::majority())
            .build(),
    );
    let docs: Vec<Document> = tokens
        .find(doc! {})
        .sort(doc! { "origin.paymentIntentId": 1, "tokenIndex": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut stored: BTreeMap<String, TokenIds> = BTreeMap::new();
    for token in docs {
        let payment = token
            .get_document("origin")
            .and_then(|o| o.get_str("paymentIntentId"))
            .unwrap_or_default()
            .to_owned();
        let index = match token.get("tokenIndex") {
            Some(Bson::Int32(v)) => i64::from(*v),
            Some(Bson::Int64(v)) => *v,
            _ => -1,
        };
        let id = token.get_object_id("_id").unwrap().to_hex();
        stored.entry(payment).or_default().push((index, id));
    }
    client.shutdown().await;
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault injection: scripts/reliability.sh"]
async fn failover_stepdown_loses_nothing_acknowledged() {
    failover_scenario(Fault::StepDown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault injection: scripts/reliability.sh"]
async fn failover_primary_killed_loses_nothing_acknowledged() {
    failover_scenario(Fault::KillPrimary).await;
}

/// The window between "applied on the primary" and "majority-committed": both secondaries
/// are paused (SIGSTOP), a first request for a payment is sent (its write is applied on the
/// primary only and waits for the majority), then an identical second request. If the
/// second is answered 2xx from the primary's not-yet-durable data, killing the primary
/// (the secondaries resume and elect a new one) loses what it acknowledged. Per mode.
async fn replication_lag_scenario() {
    let _one = ONE_AT_A_TIME.lock().await;
    eprintln!("failover[replication-lag]: starting a 3-member replica set");
    let mut set = ReplicaSet::start().await;
    let primary = set.wait_until_healthy(Duration::from_secs(60)).await;
    let secondaries: Vec<usize> = (0..3).filter(|i| *i != primary).collect();
    let database = "tokenmint_failover_lag";
    let (base, stop_app, server) = start_app(&set, database).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let modes = ["upsert", "atomic"];
    // Durable first: after the failover a replay of these must name the same ids.
    let mut warm_ids = BTreeMap::new();
    for mode in modes {
        let payment = format!("pi_lag_warm_{mode}");
        let body = issuance_body(&payment, mode);
        let warm = issue_until_ok(&http, &base, Instant::now(), &payment, &body).await;
        assert!(warm.violations.is_empty(), "{:?}", warm.violations);
        warm_ids.insert(mode, warm.acknowledged[0].1.clone());
    }

    for s in &secondaries {
        set.signal(*s, libc::SIGSTOP);
    }
    let mut firsts = Vec::new();
    for mode in modes {
        let (http, base) = (http.clone(), base.clone());
        let body = issuance_body(&format!("pi_lag_{mode}"), mode);
        firsts.push(tokio::spawn(async move {
            let response = http
                .post(format!("{base}/v1/issuances"))
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await;
            response.map(|r| r.status().as_u16()).unwrap_or(0)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The second, identical requests, while the first ones wait for the majority.
    let mut seconds: BTreeMap<&str, (u16, TokenIds)> = BTreeMap::new();
    for mode in modes {
        let body = issuance_body(&format!("pi_lag_{mode}"), mode);
        let answer = http
            .post(format!("{base}/v1/issuances"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await;
        let (status, ids) = match answer {
            Ok(response) => {
                let status = response.status().as_u16();
                (
                    status,
                    response
                        .json::<Value>()
                        .await
                        .map(|b| token_ids(&b))
                        .unwrap_or_default(),
                )
            }
            Err(_) => (0, Vec::new()),
        };
        eprintln!(
            "failover[replication-lag] {mode}: second request answered {status} while the first was not durable"
        );
        seconds.insert(mode, (status, ids));
    }

    // The primary dies; the secondaries resume and elect a new one.
    set.kill(primary);
    for s in &secondaries {
        set.signal(*s, libc::SIGCONT);
    }
    for first in firsts {
        let _ = first.await;
    }
    set.wait_until_healthy(Duration::from_secs(90)).await;
    let start = Instant::now();
    let mut violations = Vec::new();
    for mode in modes {
        let payment = format!("pi_lag_{mode}");
        let body = issuance_body(&payment, mode);
        let retried = issue_until_ok(&http, &base, start, &payment, &body).await;
        violations.extend(retried.violations);
        let Some((_, now)) = retried.acknowledged.first() else {
            continue;
        };
        let (status, acknowledged) = &seconds[mode];
        if (200..300).contains(status) && acknowledged != now {
            violations.push(format!(
                "{mode}: the second request was answered {status} with tokens {:?}..., lost in the failover; after it the payment has {:?}...",
                acknowledged.first(),
                now.first()
            ));
        }
        let warm = format!("pi_lag_warm_{mode}");
        let replay = issue_until_ok(&http, &base, start, &warm, &issuance_body(&warm, mode)).await;
        violations.extend(replay.violations);
        if replay.acknowledged.first().map(|(_, ids)| ids) != warm_ids.get(mode) {
            violations.push(format!(
                "{warm}: acknowledged before the failover, other ids after it"
            ));
        }
    }
    stop_app.stop(server).await;
    verify(&set.uri(), database, &mut violations).await;
    eprintln!(
        "failover[replication-lag] summary: second requests {:?} violations={}",
        seconds
            .iter()
            .map(|(m, (s, _))| format!("{m}={s}"))
            .collect::<Vec<_>>(),
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "failover[replication-lag]: {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault injection: scripts/reliability.sh"]
async fn failover_replay_during_replication_lag_acknowledges_only_durable_tokens() {
    replication_lag_scenario().await;
}

/// The figures' arithmetic (runs in a plain `cargo test`: no mongod needed).
#[test]
fn elections_and_no_write_windows_are_measured_from_the_samples() {
    let ms = Duration::from_millis;
    let samples = [
        (ms(0), Some(0)),
        (ms(200), Some(0)),
        (ms(400), None),
        (ms(600), None),
        (ms(800), Some(0)), // the same member again, after a stretch without primary
        (ms(1000), Some(2)), // a direct handover
        (ms(1200), Some(2)),
    ];
    let found = elections(&samples);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!((found[0].from, found[0].to), (0, 0));
    assert_eq!((found[0].lost, found[0].elected), (ms(200), ms(800)));
    assert_eq!((found[1].from, found[1].to), (0, 2));

    let successes = [ms(100), ms(150), ms(900), ms(950)];
    assert_eq!(
        longest_gap_over(&successes, ms(200), ms(800), ms(1000)),
        ms(750)
    );
    assert_eq!(
        longest_gap_over(&successes, ms(960), ms(990), ms(1000)),
        ms(50)
    );
}
