//! One segment of a target's load and what it cost: the clients run until the deadline
//! (`workload::run_segment`) while the bench reads, around them, the CPU time of the
//! service, of mongod and of itself, mongod's opcounters, and the service's resident
//! memory once a second. Kept apart from the scenario's ordering because this is where
//! the figures of the report come from. A redemption segment first issues its clients the
//! tokens they will redeem, before any of this is read, so the stock costs the figures
//! nothing.

use std::time::{Duration, Instant};

use crate::procfs::{self, Pid};
use crate::scenario::Arm;
use crate::service::Mongo;
use crate::workload::{self, Client, Operation, Stats, Workload};

/// Runs `arm` for `duration`; when `measure`, adds what happened to `arm.measured`.
pub async fn segment(
    arm: &mut Arm,
    workload: Workload,
    duration: Duration,
    mongo: &Mongo,
    measure: bool,
) {
    if workload.operation == Operation::Redeem {
        let stock = workload::stock_up(&mut arm.clients, &arm.target, workload, duration).await;
        if let Some(error) = stock.first_error {
            eprintln!("   warning: issuing the redemptions' tokens failed: {error}");
        }
    }
    // CPU time so far of the service (if the target is one), of mongod and of the bench.
    let watched = [arm.service_pid, mongo.pid().map(Pid::Id), Some(Pid::Myself)];
    let cpu_times = || watched.map(|pid| pid.and_then(procfs::cpu_time));
    let ops_before = mongo.opcounters().await;
    let before = cpu_times();
    let started = Instant::now();
    let sampler = arm
        .service_pid
        .filter(|_| measure)
        .map(|pid| tokio::spawn(sample_rss(pid, started + duration)));
    let clients = std::mem::take(&mut arm.clients);
    let (clients, stats): (Vec<Client>, Stats) =
        workload::run_segment(clients, &arm.target, workload, started + duration).await;
    arm.clients = clients;
    let rss_samples = match sampler {
        Some(sampler) => sampler.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let elapsed = started.elapsed();
    let after = cpu_times();
    let ops_after = mongo.opcounters().await;
    if !measure {
        return;
    }
    let delta = |i: usize| Some(after[i]?.saturating_sub(before[i]?));
    let m = &mut arm.measured;
    m.elapsed += elapsed;
    m.stats.add(&stats);
    m.cpu_service = add_opt(m.cpu_service, delta(0));
    m.cpu_mongod = add_opt(m.cpu_mongod, delta(1));
    m.cpu_bench = add_opt(m.cpu_bench, delta(2));
    m.rss_samples.extend(rss_samples);
    if let (Some(b), Some(a)) = (ops_before, ops_after) {
        let ops = m.ops.get_or_insert([0; 6]);
        for (i, total) in ops.iter_mut().enumerate() {
            *total += a[i] - b[i];
        }
    }
}

/// VmRSS of `pid` once a second until `until` (for the memory trend of a long run).
async fn sample_rss(pid: Pid, until: Instant) -> Vec<(Instant, u64)> {
    let mut samples = Vec::new();
    let mut every_second = tokio::time::interval(Duration::from_secs(1));
    loop {
        every_second.tick().await;
        let now = Instant::now();
        if now >= until {
            return samples;
        }
        if let Some(bytes) = procfs::resident_bytes(pid) {
            samples.push((now, bytes));
        }
    }
}

fn add_opt(total: Option<Duration>, more: Option<Duration>) -> Option<Duration> {
    match (total, more) {
        (Some(t), Some(m)) => Some(t + m),
        (None, m) => m,
        (t, None) => t,
    }
}
