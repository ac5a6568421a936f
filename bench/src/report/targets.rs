//! The performance targets, each judged against the scenarios that measure it ("met" or
//! "MISSED": reported, never asserted), and the service's memory trend they need. Apart
//! from the tables because these are the rules a reader checks against the product's
//! goals, and the thresholds live here alone.

use std::time::Instant;

use tokenmint::domain::IssuanceMode;

use super::{ScenarioResult, mib, scenario_name};
use crate::floor::Design;
use crate::workload::Operation;

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

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Each performance target against the scenarios that measure it. The floor-relative
/// targets are judged against the per-request floor, as they were before group commit;
/// the reference floor's ratio is given beside them, for information.
pub(super) fn targets(results: &[ScenarioResult]) -> Vec<String> {
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
    let issuance = |r: &&ScenarioResult| r.scenario.workload.operation == Operation::Issue;
    for r in results.iter().filter(c32).filter(issuance) {
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
    for (redeem, issue) in super::redemption_pairs(results) {
        let (Some(r), Some(i)) = (&redeem.service, &issue.service) else {
            continue;
        };
        let w = &redeem.scenario.workload;
        if w.quantity != 10 {
            continue;
        }
        let name = scenario_name(&redeem.scenario);
        if w.concurrency == 32 {
            let ratio = r.throughput_over(i);
            lines.push(format!(
                "redemption throughput ≥ 0.5× issuance of the same quantity — {name}: {:.0}/s vs {:.0}/s = {ratio:.2}× → {}",
                r.per_second(),
                i.per_second(),
                verdict(ratio >= 0.5)
            ));
        }
        if w.concurrency == 1 {
            let ratio = r.ms(0.5) / i.ms(0.5).max(1e-9);
            lines.push(format!(
                "redemption p50 at concurrency 1 ≤ 2× issuance's — {name}: {:.2} ms vs {:.2} ms = {ratio:.2}× → {}",
                r.ms(0.5),
                i.ms(0.5),
                verdict(ratio <= 2.0)
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
    use std::time::Duration;

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
