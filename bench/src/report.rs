//! The report: one row per target and scenario, tokenmint ÷ each floor (the per-request
//! floor and the reference floor), the performance targets (reported, never asserted; the
//! floor-relative ones against the per-request floor), mongod operations per issuance of
//! every target, and where each floor's database time goes.
//!
//! This file lays out the tables, both the per-scenario block printed as the run goes and
//! the markdown report; the figures they show are `measured`, the target verdicts
//! `targets`. scripts and docs parse this output: its headers and columns are a format.

mod measured;
mod targets;

use std::fmt::Write;

pub use measured::{Measured, ScenarioResult};

use crate::cli::Scenario;
use crate::floor::Design;
use crate::op_times::Op;
use crate::workload::Operation;

/// The scenario's name in every table: `c32 q4 upsert replays 0%`, and its races if any;
/// a redemption scenario `c32 q10 redeem retries 30%`.
pub fn scenario_name(scenario: &Scenario) -> String {
    let w = &scenario.workload;
    if w.operation == Operation::Redeem {
        return format!(
            "c{} q{} redeem retries {:.0}%",
            w.concurrency,
            w.quantity,
            w.replays * 100.0
        );
    }
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

/// What the redemption table shows, above it.
const REDEMPTIONS_LEGEND: &str = "Each redemption scenario (POST /v1/redemptions of the client's own tokens, issued to it beforehand and not measured; a share of requests retries a completed reference and is answered 200) beside the issuance scenario of the same concurrency, quantity and replay share run just before it, both against a fresh tokenmint. redemptions/s counts 2xx answers; refills are stocks a client ran out of during the measured window (their time is in the window, not in the latencies).";

/// Each redemption scenario with the issuance scenario of the same concurrency, quantity
/// and replay share, the one `cli` puts just before it.
fn redemption_pairs(results: &[ScenarioResult]) -> Vec<(&ScenarioResult, &ScenarioResult)> {
    results
        .windows(2)
        .filter_map(|pair| {
            let (issue, redeem) = (&pair[0].scenario.workload, &pair[1].scenario.workload);
            let same_shape = issue.concurrency == redeem.concurrency
                && issue.quantity == redeem.quantity
                && issue.replays == redeem.replays;
            (issue.operation == Operation::Issue
                && redeem.operation == Operation::Redeem
                && same_shape)
                .then_some((&pair[1], &pair[0]))
        })
        .collect()
}

/// Why tokenmint's opcounters differ from the floors', above the opcounters table.
const OPCOUNTERS_NOTE: &str = "The targets perform different operations by design, so these rows differ: tokenmint group-commits upsert mode (per batch of new payments one read of payments sent beside one insert of records, then one insert of their tokens (both inserts acknowledged by the primary alone on a replica set), one w:majority update marking the records issued, and a second read of payments only when the first is over a minute old; per batch of replays one read of records and one of tokens) and atomic mode the same way, with the records and tokens of a batch in one transaction (the payments read once, beside it; no second read, no mark). In upsert mode the floor claims a record and upserts the tokens per request, and the reference floor upserts the tokens alone; in atomic mode both floors run one transaction per request.";

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
            opt(result.service.as_ref().map(|s| s.throughput_over(store)), 2),
            opt(result.floor.as_ref().map(|f| store.throughput_over(f)), 2),
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

    let pairs = redemption_pairs(results);
    if !pairs.is_empty() {
        let _ = writeln!(
            out,
            "\n#### Redemptions beside issuances (same run)\n\n{REDEMPTIONS_LEGEND}\n\n| scenario | redemptions/s | tokens redeemed/s | p50 ms | p99 ms | issuances/s (same quantity) | p50 ms | p99 ms | redemptions ÷ issuances: throughput | p50 | refills |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for (redeem, issue) in &pairs {
            let (Some(r), Some(i)) = (&redeem.service, &issue.service) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                scenario_name(&redeem.scenario),
                r.per_second(),
                r.tokens_per_second(),
                r.ms(0.5),
                r.ms(0.99),
                i.per_second(),
                i.ms(0.5),
                i.ms(0.99),
                r.throughput_over(i),
                r.ms(0.5) / i.ms(0.5).max(1e-9),
                r.stats.refills,
            );
        }
    }

    let _ = writeln!(out, "\n#### Targets (reported, never asserted)\n");
    for line in targets::targets(results) {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokenmint::domain::IssuanceMode;

    use super::*;

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
                    operation: Operation::Issue,
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
}
