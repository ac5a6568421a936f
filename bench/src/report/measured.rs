//! The figures of a scenario: what each target measured (throughput, latency percentiles,
//! CPU per issuance, mongod operations, statuses) and tokenmint ÷ each floor. Apart from
//! the tables so that the tables and the target verdicts read the same numbers, computed
//! once.

use std::time::{Duration, Instant};

use super::opt;
use crate::cli::Scenario;
use crate::floor::Design;
use crate::workload::Stats;

/// What one target did over a scenario's measured segments.
#[derive(Default)]
pub struct Measured {
    pub stats: Stats,
    pub elapsed: Duration,
    pub cpu_service: Option<Duration>,
    pub cpu_mongod: Option<Duration>,
    pub cpu_bench: Option<Duration>,
    /// mongod opcounters over the measured segments (all clients; the bench's own
    /// `serverStatus` calls included).
    pub ops: Option<crate::service::OpCounters>,
    /// The service's VmRSS, sampled every second of its measured segments.
    pub rss_samples: Vec<(Instant, u64)>,
}

impl Measured {
    /// Successful issuances per second.
    pub fn per_second(&self) -> f64 {
        self.rate(self.stats.ok)
    }

    /// Tokens inserted per second.
    pub(super) fn tokens_per_second(&self) -> f64 {
        self.rate(self.stats.created)
    }

    fn rate(&self, count: u64) -> f64 {
        count as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// This target's throughput ÷ `other`'s (the `--with-store` splits).
    pub(super) fn throughput_over(&self, other: &Measured) -> f64 {
        self.per_second() / other.per_second().max(1e-9)
    }

    /// CPU microseconds per successful issuance.
    pub(super) fn per_issuance(&self, cpu: Option<Duration>) -> Option<f64> {
        let cpu = cpu?;
        (self.stats.ok > 0).then(|| cpu.as_secs_f64() * 1e6 / self.stats.ok as f64)
    }

    /// Latency percentile in milliseconds.
    pub(super) fn ms(&self, quantile: f64) -> f64 {
        self.stats.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    /// The slowest request in milliseconds.
    pub(super) fn max_ms(&self) -> f64 {
        self.stats.latency.max() as f64 / 1000.0
    }

    /// mongod operations per successful issuance, by counter.
    pub(super) fn ops_per_issuance(&self) -> String {
        let Some(ops) = self.ops.filter(|_| self.stats.ok > 0) else {
            return "n/a".to_owned();
        };
        crate::service::OPCOUNTER_NAMES
            .iter()
            .zip(ops)
            .filter(|(_, count)| *count > 0)
            .map(|(name, count)| format!("{name} {:.2}", count as f64 / self.stats.ok as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Answers by status, `201×n` each.
    pub(super) fn statuses(&self) -> String {
        self.stats
            .by_status
            .iter()
            .map(|(status, count)| format!("{status}×{count}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One scenario's figures.
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub service: Option<Measured>,
    /// tokenmint's `Store::issue` without HTTP (with `--with-store`).
    pub store: Option<Measured>,
    /// The per-request floor: tokenmint's design before group commit.
    pub floor: Option<Measured>,
    /// The reference design's upsert floor: one unordered bulk of upserts per issuance.
    pub reference_floor: Option<Measured>,
    /// VmRSS of the service at the end of the scenario.
    pub service_rss: Option<u64>,
    pub mongod_rss: Option<u64>,
}

impl ScenarioResult {
    /// The targets this scenario measured, in report order, with their names.
    pub(super) fn measured(&self) -> impl Iterator<Item = (&'static str, &Measured)> {
        [
            ("tokenmint", &self.service),
            ("store", &self.store),
            (Design::PerRequest.name(), &self.floor),
            (Design::Reference.name(), &self.reference_floor),
        ]
        .into_iter()
        .filter_map(|(name, m)| Some((name, m.as_ref()?)))
    }

    /// What `floor` did, if the scenario measured it.
    pub(super) fn floor(&self, floor: Design) -> Option<&Measured> {
        match floor {
            Design::PerRequest => self.floor.as_ref(),
            Design::Reference => self.reference_floor.as_ref(),
        }
    }

    /// tokenmint's `f` ÷ `floor`'s.
    fn ratio(&self, floor: Design, f: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
        let service = f(self.service.as_ref()?)?;
        let floor = f(self.floor(floor)?)?;
        (floor > 0.0).then(|| service / floor)
    }

    pub(super) fn throughput_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| Some(m.per_second()))
    }

    fn mongod_cpu_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| m.per_issuance(m.cpu_mongod))
    }

    pub(super) fn p50_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| Some(m.ms(0.5)))
    }

    /// tokenmint ÷ `floor`: throughput, mongod CPU per issuance, p50, p99 — table cells.
    pub(super) fn ratio_cells(&self, floor: Design) -> [String; 4] {
        [
            opt(self.throughput_ratio(floor), 2),
            opt(self.mongod_cpu_ratio(floor), 2),
            opt(self.p50_ratio(floor), 2),
            opt(self.ratio(floor, |m| Some(m.ms(0.99))), 2),
        ]
    }
}
