//! Logs and metrics.
//!
//! Logging rules (enforced in review): ids go in fields, not in messages; never log an
//! API key, a webhook secret, a full webhook body or a driver error in a response; a
//! failure is logged once, where it is handled (`ApiError::from(StoreError)` for store
//! failures), at `warn` when the caller can retry and `error` when it is a bug.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, LogSettings};

/// Installs the global tracing subscriber (JSON or human-readable).
pub fn init_logging(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal (and not with NO_COLOR): a pipe or log file gets plain text.
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let result = match settings.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
    // A second init (tests build several apps in one process) keeps the first subscriber.
    drop(result);
}

/// The process-wide Prometheus recorder; installed on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".to_owned()),
                    &[
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0,
                    ],
                )
                .expect("static buckets are valid")
                .install_recorder()
                .expect("the metrics recorder is installed once");
            describe_metrics();
            handle
        })
        .clone()
}

/// Drains histogram samples into buckets periodically, so memory stays flat even when
/// nobody scrapes `/metrics`.
pub fn spawn_metrics_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

/// 1 when the last readiness check reached MongoDB, 0 otherwise.
pub fn record_database_up(up: bool) {
    metrics::gauge!("tokenmint_mongodb_up").set(if up { 1.0 } else { 0.0 });
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "tokenmint_http_requests_total",
        "HTTP requests by method, route template and status"
    );
    describe_histogram!(
        "tokenmint_http_request_duration_seconds",
        "HTTP request latency"
    );
    describe_counter!(
        "tokenmint_issuances_total",
        "Issuance requests by outcome (created, replayed, conflict, pending)"
    );
    describe_counter!("tokenmint_tokens_created_total", "Tokens inserted");
    describe_counter!(
        "tokenmint_tokens_revoked_total",
        "Active tokens revoked because their payment no longer stands for them, by reason (refunded, canceled, partial_refund)"
    );
    describe_counter!(
        "tokenmint_repairs_total",
        "Unfinished issuances finished by self-repair, by outcome (completed, revoked, failed)"
    );
    describe_histogram!(
        "tokenmint_issuance_batch_size",
        "Upsert-mode issuances committed together by one group commit"
    );
    describe_counter!(
        "tokenmint_duplicate_key_retries_total",
        "Duplicate-key races retried"
    );
    describe_counter!(
        "tokenmint_transaction_retries_total",
        "Transactions retried after a transient error"
    );
    describe_counter!(
        "tokenmint_version_gate_rejections_total",
        "Stale writes rejected by the _version gate"
    );
    describe_counter!(
        "tokenmint_webhook_events_total",
        "Webhook events by provider and outcome"
    );
    describe_gauge!(
        "tokenmint_mongodb_up",
        "1 when MongoDB answered the last readiness check"
    );
}
