//! Traces: OpenTelemetry over OTLP/HTTP (protobuf) when `telemetry.otlp_endpoint` is set.
//!
//! The `tracing` spans tokenmint already opens (the request, the group-commit batch,
//! webhook verification and processing) become OpenTelemetry spans through
//! `tracing-opentelemetry`; an incoming W3C `traceparent` makes the request span a child
//! of the caller's; and each MongoDB command gets a span of its own from the driver's
//! command events (`commands`). Without an endpoint nothing here runs: no exporter, no
//! command events (they copy every command document), no cost.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::settings::OtlpEndpoint;

/// Whether spans are exported: without it, what only feeds OpenTelemetry (a request's
/// span name, a batch's links) is not computed at all — it would cost every request an
/// allocation and a context lookup for nothing.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The exporting side of tracing, kept by whoever runs the process: `shutdown` sends
/// what is still buffered.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// An OTLP/HTTP exporter to `endpoint`, batching spans in the background.
    pub fn export_to(endpoint: &OtlpEndpoint) -> anyhow::Result<Self> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.traces_url())
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("tokenmint")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Self { provider })
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("tokenmint"))
    }

    /// Sends the spans still buffered, then stops the exporter. It blocks (the exporter
    /// runs on a thread of its own), so async callers run it on a blocking thread.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "traces not all exported at shutdown");
        }
    }
}

/// Makes `span` a child of the caller's trace when the request carries a valid W3C
/// `traceparent` (with its `tracestate`); anything else leaves `span` a root.
pub fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    struct Headers<'a>(&'a HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|value| value.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|name| name.as_str()).collect()
        }
    }
    if !EXPORTING.load(Ordering::Relaxed) || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    // Fails only when the span is disabled (no OpenTelemetry layer): nothing to join.
    let _ = span.set_parent(parent);
}

/// Names `span`'s OpenTelemetry span `name` (a request's method and route template,
/// known only once the router matched; by then the span has started, and
/// `tracing-opentelemetry` takes an `otel.name` recorded after the start no more).
pub fn rename(span: &tracing::Span, name: impl FnOnce() -> String) {
    use opentelemetry::trace::TraceContextExt;
    if EXPORTING.load(Ordering::Relaxed) {
        span.context().span().update_name(name());
    }
}

/// Links `span` to the trace of each request it serves (a group-commit batch serves
/// many, and belongs to none of them).
pub fn link_to(span: &tracing::Span, requests: impl IntoIterator<Item = tracing::Span>) {
    use opentelemetry::trace::TraceContextExt;
    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    for request in requests {
        let context = request.context();
        let request = context.span().span_context().clone();
        if request.is_valid() {
            span.add_link(request);
        }
    }
}
