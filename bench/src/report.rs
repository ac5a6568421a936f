//! The report: one row per target and scenario, tokenmint ÷ each floor (the per-request
//! floor and the reference floor), the performance targets (reported, never asserted; the
//! floor-relative ones against the per-request floor), mongod operations per issuance of
//! every target, and where each floor's database time goes.

use std::fmt::Write;
use std::time::{Duration, Instant};

use tokenmint::domain::IssuanceMode;

use crate::cli::Scenario;
use crate::floor::Design;
use crate::op_times::Op;
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
    pub fn per_second(&self) -> f64 {
        self.stats.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn tokens_per_second(&self) -> f64 {
        self.stats.created as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// CPU microseconds per successful issuance.
    fn per_issuance(&self, cpu: Option<Duration>) -> Option<f64> {
        let cpu = cpu?;
        (self.stats.ok > 0).then(|| cpu.as_secs_f64() * 1e6 / self.stats.ok as f64)
    }

    /// Latency percentile in milliseconds.
    fn ms(&self, quantile: f64) -> f64 {
        self.stats.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    fn max_ms(&self) -> f64 {
        self.stats.latency.max() as f64 / 1000.0
    }

    /// mongod operations per successful issuance, by counter.
    fn ops_per_issuance(&self) -> String {
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

    fn statuses(&self) -> String {
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
    fn measured(&self) -> impl Iterator<Item = (&'static str, &Measured)> {
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
    fn floor(&self, floor: Design) -> Option<&Measured> {
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

    fn throughput_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| Some(m.per_second()))
    }

    fn mongod_cpu_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| m.per_issuance(m.cpu_mongod))
    }

    fn p50_ratio(&self, floor: Design) -> Option<f64> {
        self.ratio(floor, |m| Some(m.ms(0.5)))
    }

    /// tokenmint ÷ `floor`: throughput, mongod CPU per issuance, p50, p99 — table cells.
    fn ratio_cells(&self, floor: Design) -> [String; 4] {
        [
            opt(self.throughput_ratio(floor), 2),
            opt(self.mongod_cpu_ratio(floor), 2),
            opt(self.p50_ratio(floor), 2),
            opt(self.ratio(floor, |m| Some(m.ms(0.99))), 2),
        ]
    }
}

/// Below this many minutes of samples a memory trend is reported but not judged.
const TREND_MINUTES: f64 = 4.0;

/// The service's resident memory over a scenario: how long it was sampled, the last and the
/// largest sample, and the least-squares slope over the second half of the samples (after
/// the pools and caches have filled), in MiB per minute.
struct RssTrend {
    minutes: f64,
    last: u64,
    largest: u64,
    slope_mib_per_minute: f64,
}

impl RssTrend {
    fn of(samples: &[(Instant, u64)]) -> Option<Self> {
        let (first, _) = *samples.first()?;
        let &(end, last) = samples.last()?;
        let points: Vec<(f64, f64)> = samples[samples.len() / 2..]
            .iter()
            .map(|(at, bytes)| {
                let minutes = at.duration_since(first).as_secs_f64() / 60.0;
                (minutes, *bytes as f64 / (1024.0 * 1024.0))
            })
            .collect();
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
        Some(Self {
            minutes: end.duration_since(first).as_secs_f64() / 60.0,
            last,
            largest: samples.iter().map(|s| s.1).max()?,
            slope_mib_per_minute: if sxx > 0.0 { sxy / sxx } else { 0.0 },
        })
    }

    /// No growth: the slope is under 1 % of the largest sample per minute.
    fn grows(&self) -> bool {
        self.slope_mib_per_minute > 0.01 * self.largest as f64 / (1024.0 * 1024.0)
    }
}

pub fn scenario_name(scenario: &Scenario) -> String {
    let w = &scenario.workload;
    let mut name = format!(
        "c{} q{} {} replays {:.0}%",
        w.concurrency,
        w.quantity,
        w.mode.as_str(),
        w.replays * 100.0
    );
    if w.races > 0.0 {
        let _ = write!(name, " races {:.0}%", w.races * 100.0);
    }
    name
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

fn mib(bytes: Option<u64>) -> String {
    opt(bytes.map(|b| b as f64 / (1024.0 * 1024.0)), 1)
}

fn row(name: &str, target: &str, m: &Measured) -> String {
    format!(
        "| {name} | {target} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} | {} | {} |",
        m.per_second(),
        m.tokens_per_second(),
        m.ms(0.5),
        m.ms(0.9),
        m.ms(0.99),
        m.max_ms(),
        opt(m.per_issuance(m.cpu_service), 0),
        opt(m.per_issuance(m.cpu_mongod), 0),
        opt(m.per_issuance(m.cpu_bench), 0),
        m.statuses(),
    )
}

/// What the two floors are, above the ratio table.
const FLOORS_LEGEND: &str = "floor: the per-request floor, tokenmint's design before group commit (upsert: the record claimed with a findOneAndUpdate upsert, then one unordered bulk of $setOnInsert token upserts; atomic: one transaction), issued directly with the mongodb crate. reference floor: the reference design's upsert floor, one unordered bulk of $setOnInsert upserts per issuance keyed by the token unique index, no issuance record, a read-back only on a replay; in atomic mode it runs the same transaction as the floor, so there the two floors differ only by the run's noise. Ratios above 1 for throughput, below 1 for CPU and latency, favour tokenmint.";

/// Why tokenmint's opcounters differ from the floors', above the opcounters table.
const OPCOUNTERS_NOTE: &str = "The targets perform different operations by design, so these rows differ: tokenmint group-commits upsert mode (per batch of new payments one read of payments, one insert of records, one w:majority insert of their tokens, one read of payments again, one update marking the records issued; per batch of replays one read of records and one of tokens) and in atomic mode reads the payment before and after its transaction and marks the record issued. In upsert mode the floor claims a record and upserts the tokens per request, and the reference floor upserts the tokens alone; in atomic mode both floors run one transaction per request.";

const RESULT_HEADER: &str = "| scenario | target | issuances/s | tokens/s | p50 ms | p90 ms | p99 ms | max ms | service CPU µs/iss | mongod CPU µs/iss | bench CPU µs/iss | statuses |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|";

/// The per-scenario block printed as the run goes.
pub fn scenario_detail(result: &ScenarioResult) -> String {
    let name = scenario_name(&result.scenario);
    let mut out = String::new();
    let _ = writeln!(out, "{RESULT_HEADER}");
    for (target, m) in result.measured() {
        let _ = writeln!(out, "{}", row(&name, target, m));
        let _ = writeln!(
            out,
            "   mongod ops/issuance ({target}): {}",
            m.ops_per_issuance()
        );
        if let Some(error) = &m.stats.first_error {
            let _ = writeln!(out, "   first error ({target}): {}", truncate(error, 300));
        }
    }
    if let Some(store) = &result.store {
        let _ = writeln!(
            out,
            "tokenmint ÷ store (the HTTP layer): throughput {}; store ÷ floor (tokenmint's issuing and store code against the per-request floor): throughput {}",
            opt(
                result
                    .service
                    .as_ref()
                    .map(|s| s.per_second() / store.per_second().max(1e-9)),
                2
            ),
            opt(
                result
                    .floor
                    .as_ref()
                    .map(|f| store.per_second() / f.per_second().max(1e-9)),
                2
            ),
        );
    }
    for floor in Design::ALL {
        let [throughput, mongod_cpu, p50, _] = result.ratio_cells(floor);
        let _ = writeln!(
            out,
            "tokenmint ÷ {}: throughput {throughput}, mongod CPU/iss {mongod_cpu}, p50 {p50}",
            floor.name()
        );
    }
    let _ = write!(
        out,
        "service RSS {} MiB, mongod RSS {} MiB",
        mib(result.service_rss),
        mib(result.mongod_rss),
    );
    out
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The whole report, in markdown, ready for docs/BENCHMARKS.md.
pub fn markdown(results: &[ScenarioResult], command: &str, machine: &str, load: &str) -> String {
    let mut out = String::new();
    let now = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
    let _ = writeln!(out, "### Run of {now}\n");
    let _ = writeln!(out, "- command: `{command}`");
    let _ = writeln!(out, "- machine: {machine}");
    let _ = writeln!(out, "- load average (1, 5, 15 min): {load}");
    if let Some(first) = results.first() {
        let s = &first.scenario;
        let _ = writeln!(
            out,
            "- per scenario: a fresh tokenmint process and databases; {:.0} s warm-up per target, then {:.0} s measured per target, interleaved tokenmint ½ · (store ½) · floor ½ · reference floor 1 · floor ½ · (store ½) · tokenmint ½",
            s.warmup.as_secs_f64(),
            s.duration.as_secs_f64()
        );
    }
    let _ = writeln!(out, "\n{RESULT_HEADER}");
    for result in results {
        let name = scenario_name(&result.scenario);
        for (target, m) in result.measured() {
            let _ = writeln!(out, "{}", row(&name, target, m));
        }
    }

    let ratio_columns: Vec<String> = Design::ALL
        .iter()
        .flat_map(|floor| {
            ["throughput", "mongod CPU/iss", "p50", "p99"]
                .map(|figure| format!("÷ {}: {figure}", floor.name()))
        })
        .collect();
    let _ = writeln!(
        out,
        "\n#### tokenmint ÷ floor and tokenmint ÷ reference floor (same run)\n\n{FLOORS_LEGEND}\n\n| scenario | {} | service RSS at end (MiB) | mongod RSS (MiB) |\n|---|{}--:|--:|",
        ratio_columns.join(" | "),
        "--:|".repeat(ratio_columns.len()),
    );
    for result in results {
        let ratios = Design::ALL.map(|floor| result.ratio_cells(floor).join(" | "));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            scenario_name(&result.scenario),
            ratios.join(" | "),
            mib(result.service_rss),
            mib(result.mongod_rss),
        );
    }

    let _ = writeln!(out, "\n#### Targets (reported, never asserted)\n");
    for line in targets(results) {
        let _ = writeln!(out, "- {line}");
    }

    let _ = writeln!(
        out,
        "\n#### mongod operations per issuance (serverStatus opcounters)\n\n{OPCOUNTERS_NOTE}\n\n| scenario | target | operations per issuance |\n|---|---|---|"
    );
    for result in results {
        for (target, m) in result.measured() {
            let _ = writeln!(
                out,
                "| {} | {target} | {} |",
                scenario_name(&result.scenario),
                m.ops_per_issuance()
            );
        }
    }

    let _ = writeln!(
        out,
        "\n#### Floors: time per database operation (µs; p50 / p99, count)\n\n| scenario | floor | operation | p50 | p99 | count |\n|---|---|---|--:|--:|--:|"
    );
    for result in results {
        for floor in Design::ALL {
            let Some(measured) = result.floor(floor) else {
                continue;
            };
            for (op, hist) in Op::ALL.iter().zip(&measured.stats.op_times.hists) {
                if hist.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    scenario_name(&result.scenario),
                    floor.name(),
                    op.name(),
                    hist.value_at_quantile(0.5),
                    hist.value_at_quantile(0.99),
                    hist.len()
                );
            }
        }
    }
    out
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Each performance target against the scenarios that measure it. The floor-relative
/// targets are judged against the per-request floor, as they were before group commit;
/// the reference floor's ratio is given beside them, for information.
fn targets(results: &[ScenarioResult]) -> Vec<String> {
    let against_reference = |ratio: Option<f64>| {
        ratio.map_or_else(String::new, |ratio| {
            format!(" (against the reference floor: {ratio:.2}×)")
        })
    };
    let mut lines = Vec::new();
    let c32 = |r: &&ScenarioResult| r.scenario.workload.concurrency == 32;
    let c1 = |r: &&ScenarioResult| r.scenario.workload.concurrency == 1;
    for (mode, floor_share) in [(IssuanceMode::Upsert, 0.85), (IssuanceMode::Atomic, 0.8)] {
        for r in results
            .iter()
            .filter(c32)
            .filter(|r| r.scenario.workload.mode == mode)
        {
            if let Some(ratio) = r.throughput_ratio(Design::PerRequest) {
                lines.push(format!(
                    "{} throughput ≥ {floor_share}× floor — {}: {ratio:.2}× → {}{}",
                    mode.as_str(),
                    scenario_name(&r.scenario),
                    verdict(ratio >= floor_share),
                    against_reference(r.throughput_ratio(Design::Reference)),
                ));
            }
        }
    }
    for r in results
        .iter()
        .filter(c32)
        .filter(|r| r.scenario.workload.quantity == 4)
    {
        if let Some(cpu) = r
            .service
            .as_ref()
            .and_then(|m| m.per_issuance(m.cpu_service))
        {
            lines.push(format!(
                "service CPU ≤ 150 µs/issuance — {}: {cpu:.0} µs → {}",
                scenario_name(&r.scenario),
                verdict(cpu <= 150.0)
            ));
        }
    }
    for r in results.iter().filter(c32) {
        if let Some(m) = &r.service {
            let (p50, p99) = (m.ms(0.5), m.ms(0.99));
            lines.push(format!(
                "p99 ≤ 3× p50 — {}: p99 {p99:.2} ms = {:.2}× p50 {p50:.2} ms → {}",
                scenario_name(&r.scenario),
                p99 / p50.max(1e-9),
                verdict(p99 <= 3.0 * p50)
            ));
        }
    }
    for r in results.iter().filter(c1) {
        let ratio = r.p50_ratio(Design::PerRequest);
        if let (Some(ratio), Some(s), Some(f)) = (ratio, &r.service, &r.floor) {
            lines.push(format!(
                "p50 at concurrency 1 ≤ 1.3× floor — {}: {:.2} ms vs {:.2} ms = {ratio:.2}× → {}{}",
                scenario_name(&r.scenario),
                s.ms(0.5),
                f.ms(0.5),
                verdict(ratio <= 1.3),
                against_reference(r.p50_ratio(Design::Reference)),
            ));
        }
    }
    for r in results {
        let Some(trend) = r
            .service
            .as_ref()
            .and_then(|m| RssTrend::of(&m.rss_samples))
        else {
            continue;
        };
        let judged = if trend.minutes < TREND_MINUTES {
            format!("too short to judge a trend (under {TREND_MINUTES} min)")
        } else {
            verdict(trend.largest <= 64 * 1024 * 1024 && !trend.grows()).to_owned()
        };
        lines.push(format!(
            "service RSS ≤ 64 MiB after minutes of load, no growth trend — {}: {} MiB after {:.1} min (largest {} MiB), slope over the second half {:+.3} MiB/min → {judged}",
            scenario_name(&r.scenario),
            mib(Some(trend.last)),
            trend.minutes,
            mib(Some(trend.largest)),
            trend.slope_mib_per_minute,
        ));
    }
    let rss: Vec<(String, u64)> = results
        .iter()
        .filter_map(|r| Some((scenario_name(&r.scenario), r.service_rss?)))
        .collect();
    if let Some((name, max)) = rss.iter().max_by_key(|(_, b)| *b) {
        lines.push(format!(
            "service RSS ≤ 64 MiB — largest at the end of a scenario: {} MiB ({name}) → {}",
            mib(Some(*max)),
            verdict(*max <= 64 * 1024 * 1024)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// One sample a second for `minutes`, growing by `per_minute` MiB a minute from 20 MiB.
    fn samples(minutes: u64, per_minute: f64) -> Vec<(Instant, u64)> {
        let start = Instant::now();
        (0..=minutes * 60)
            .map(|second| {
                let mib = 20.0 + per_minute * second as f64 / 60.0;
                (
                    start + Duration::from_secs(second),
                    (mib * MIB as f64) as u64,
                )
            })
            .collect()
    }

    /// `ok` issuances in 10 s, with `mongod_ms` of mongod CPU.
    fn measured(ok: u64, mongod_ms: u64) -> Measured {
        let mut m = Measured {
            elapsed: Duration::from_secs(10),
            cpu_mongod: Some(Duration::from_millis(mongod_ms)),
            ops: Some([4 * ok as i64, 0, 0, 0, 0, 0]),
            ..Measured::default()
        };
        m.stats.ok = ok;
        m
    }

    fn scenario_result() -> ScenarioResult {
        ScenarioResult {
            scenario: Scenario {
                workload: crate::workload::Workload {
                    concurrency: 32,
                    quantity: 4,
                    mode: IssuanceMode::Upsert,
                    replays: 0.0,
                    races: 0.0,
                },
                duration: Duration::from_secs(10),
                warmup: Duration::from_secs(1),
                service: true,
                floor: true,
                reference_floor: true,
            },
            service: Some(measured(900, 900)),
            store: None,
            floor: Some(measured(1000, 1200)),
            reference_floor: Some(measured(1200, 600)),
            service_rss: None,
            mongod_rss: None,
        }
    }

    #[test]
    fn tokenmint_is_divided_by_each_floor() {
        let result = scenario_result();
        assert_eq!(
            result.ratio_cells(Design::PerRequest)[..2],
            ["0.90", "0.83"]
        );
        assert_eq!(result.ratio_cells(Design::Reference)[..2], ["0.75", "2.00"]);
        let report = markdown(&[result], "bench", "machine", "load");
        let table: Vec<&str> = report
            .lines()
            .skip_while(|line| !line.starts_with("#### tokenmint ÷ floor and"))
            .filter(|line| line.starts_with('|'))
            .take(3)
            .collect();
        let columns = |line: &str| line.matches('|').count();
        assert_eq!(table.len(), 3, "{report}");
        assert!(table.iter().all(|line| columns(line) == columns(table[0])));
        assert!(table[0].contains("÷ reference floor: mongod CPU/iss"));
        assert!(table[2].starts_with("| c32 q4 upsert replays 0% | 0.90 | 0.83 |"));
        assert!(report.contains("| c32 q4 upsert replays 0% | reference floor | insert 4.00 |"));
        assert!(report.contains("(against the reference floor: 0.75×)"));
    }

    #[test]
    fn a_steady_service_has_no_growth_trend() {
        let trend = RssTrend::of(&samples(5, 0.0)).unwrap();
        assert!((trend.minutes - 5.0).abs() < 1e-9);
        assert_eq!(trend.last, 20 * MIB);
        assert!(trend.slope_mib_per_minute.abs() < 1e-6);
        assert!(!trend.grows());
    }

    #[test]
    fn a_leak_shows_as_a_slope() {
        let trend = RssTrend::of(&samples(5, 2.0)).unwrap();
        assert!((trend.slope_mib_per_minute - 2.0).abs() < 0.01);
        assert_eq!(trend.largest, trend.last);
        assert!(trend.grows());
    }
}
