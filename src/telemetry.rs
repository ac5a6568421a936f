//! Logs, traces (`traces`) and metrics. Every metric's name and help text is in `metric`; the process's
//! own metrics (`process_*`: CPU, memory, file descriptors, threads) come from the
//! `metrics-process` collector, sampled by the upkeep task.
//!
//! Logging rules (enforced in review): ids go in fields, not in messages; never log an
//! API key, a webhook secret, a full webhook body or a driver error in a response; a
//! failure is logged once, where it is handled (`ApiError::from(StoreError)` for store
//! failures), at `warn` when the caller can retry and `error` when it is a bug. Text a
//! client or provider chose (a method, a path, an id) is logged through `Bounded`.

pub mod commands;
pub mod metric;
pub mod traces;

use std::future::Future;
use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, LogSettings, TelemetrySettings};
use traces::Traces;
use tracing_subscriber::Layer as _;

/// Displays at most `Bounded::LIMIT` bytes of a client-chosen text, then how many bytes
/// were left out: a 200 KB method token must not make a 200 KB log line (twice: the span
/// is on the request's line and on its access log line).
pub struct Bounded<'a>(pub &'a str);

impl Bounded<'_> {
    /// Bytes kept; more than any route template, payment id or method tokenmint knows.
    pub const LIMIT: usize = 256;
}

impl std::fmt::Display for Bounded<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0;
        if text.len() <= Self::LIMIT {
            return f.write_str(text);
        }
        let mut end = Self::LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}…(+{} bytes)", &text[..end], text.len() - end)
    }
}

/// Installs the global tracing subscriber (JSON or human-readable logs, and spans to
/// the OTLP collector when `telemetry.otlp_endpoint` is set). Keep the answer for as
/// long as the process runs, then `Traces::shutdown` it: it exports what is buffered.
pub fn init(log: &LogSettings, telemetry: &TelemetrySettings) -> anyhow::Result<Option<Traces>> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal (and not with NO_COLOR): a pipe or log file gets plain text.
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let logs = match log.format {
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
        LogFormat::Pretty => logs.boxed(),
    };
    let traces = telemetry
        .otlp_endpoint
        .as_ref()
        .map(Traces::export_to)
        .transpose()?;
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces.as_ref().map(Traces::layer))
        .try_init();
    // A second init (tests build several apps in one process) keeps the first subscriber.
    drop(result);
    Ok(traces)
}

/// The process-wide Prometheus recorder; installed on first use, with every metric
/// described and the process metrics sampled once.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".to_owned()),
                    metric::LATENCY_BUCKETS,
                )
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Suffix("_batch_size".to_owned()),
                        metric::BATCH_SIZE_BUCKETS,
                    )
                })
                .expect("static buckets are valid")
                .install_recorder()
                .expect("the metrics recorder is installed once");
            metric::describe();
            process_collector().describe();
            process_collector().collect();
            handle
        })
        .clone()
}

/// Registers at 0 the counters whose labels are known from the start (webhook outcomes
/// for each of `providers`), and sets `tokenmint_build_info`.
pub fn register_known_metrics<'a>(providers: impl IntoIterator<Item = &'a str>) {
    metrics_handle();
    metric::register_known(providers);
}

fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Every 5 s: samples the process metrics, and drains histogram samples into buckets so
/// memory stays flat even when nobody scrapes `/metrics`.
pub fn spawn_metrics_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            process_collector().collect();
            handle.run_upkeep();
        }
    })
}

/// Keeps `tokenmint_mongodb_up` current without waiting for a `/readyz` call: runs
/// `ping` every `every` and records whether it answered within that time (a paused
/// server answers nothing, and must read as down, not as a probe stuck forever).
/// Abort the returned task at shutdown.
pub fn spawn_database_probe<F, P>(every: Duration, ping: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> P + Send + 'static,
    P: Future<Output = bool> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let up = tokio::time::timeout(every, ping()).await.unwrap_or(false);
            record_database_up(up);
        }
    })
}

/// 1 when MongoDB answered the last check (the probe's or readiness'), 0 otherwise.
pub fn record_database_up(up: bool) {
    metrics::gauge!(metric::MONGODB_UP).set(if up { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::Bounded;

    #[test]
    fn short_text_is_kept_whole() {
        assert_eq!(Bounded("GET").to_string(), "GET");
        let limit = "a".repeat(Bounded::LIMIT);
        assert_eq!(Bounded(&limit).to_string(), limit);
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_and_says_how_much_is_left_out() {
        let long = "é".repeat(100_000);
        let shown = Bounded(&long).to_string();
        assert!(shown.len() < Bounded::LIMIT + 32, "{}", shown.len());
        assert!(shown.starts_with(&"é".repeat(Bounded::LIMIT / 2)));
        assert!(shown.ends_with(&format!("…(+{} bytes)", long.len() - Bounded::LIMIT)));
    }
}
