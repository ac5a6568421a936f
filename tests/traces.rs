//! Traces: a real `tokenmint serve` exporting to an OTLP/HTTP receiver started here (the
//! protobuf messages of `opentelemetry-proto`, decoded as a collector would). A request
//! with a W3C `traceparent` yields spans in that trace — the request's, the webhook's
//! verification and processing, each MongoDB command — and the group-commit batch a
//! request joined links to it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use tokenmint_test_support::*;

type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP receiver on a free port: every span posted to `/v1/traces` is kept.
async fn receiver() -> (String, Received) {
    async fn traces(State(received): State<Received>, body: Bytes) -> Vec<u8> {
        let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
        let spans = request
            .resource_spans
            .into_iter()
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans);
        received.lock().unwrap().extend(spans);
        ExportTraceServiceResponse::default().encode_to_vec()
    }
    let received = Received::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), received)
}

const STRIPE_SECRET: &str = "whsec_test_old_secret_0123456789";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The spans received so far whose trace id is `trace`.
fn in_trace(received: &Received, trace: &str) -> Vec<Span> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|span| hex(&span.trace_id) == trace)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_traceparent_is_continued_through_the_request_its_batch_and_mongodb() {
    let (endpoint, received) = receiver().await;
    let scratch = ScratchDatabase::create("traces").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.toml");
    std::fs::write(
        &config,
        format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"{STRIPE_SECRET}\"]\n"),
    )
    .unwrap();
    let service = Service::start_with(
        scratch.name(),
        &[
            ("TOKENMINT_CONFIG", config.to_str().unwrap()),
            ("TOKENMINT__TELEMETRY__OTLP_ENDPOINT", &endpoint),
            // Export every 100 ms rather than every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let http = reqwest::Client::new();

    let issuance_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let issued = http
        .post(format!("{}/v1/issuances", service.base))
        .bearer_auth(SERVICE_KEY)
        .header(
            "traceparent",
            format!("00-{issuance_trace}-{caller_span}-01"),
        )
        .json(&issuance_body("pi_traced", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(issued.status(), 201);

    let webhook_trace = "0af7651916cd43dd8448eb211c80319c";
    let now = chrono::Utc::now().timestamp();
    let event = json!({
        "id": "evt_traced", "type": "payment_intent.processing", "created": now,
        "data": { "object": { "id": "pi_traced_webhook", "object": "payment_intent",
            "status": "processing", "amount": 100, "currency": "eur", "metadata": {} } }
    })
    .to_string();
    let delivered = http
        .post(format!("{}/v1/webhooks/stripe", service.base))
        .header(
            "stripe-signature",
            tokenmint::webhooks::signature::sign_stripe(STRIPE_SECRET, now, event.as_bytes()),
        )
        .header("content-type", "application/json")
        .header(
            "traceparent",
            format!("00-{webhook_trace}-{caller_span}-01"),
        )
        .body(event)
        .send()
        .await
        .unwrap();
    assert_eq!(delivered.status(), 200);

    // Spans arrive in batches: wait until every expected one is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let named = |spans: &[Span], name: &str| spans.iter().find(|s| s.name == name).cloned();
    loop {
        let issuance = in_trace(&received, issuance_trace);
        let webhook = in_trace(&received, webhook_trace);
        let batch = received
            .lock()
            .unwrap()
            .iter()
            .find(|span| {
                span.name == "batch"
                    && span
                        .links
                        .iter()
                        .any(|link| hex(&link.trace_id) == issuance_trace)
            })
            .cloned();
        let request = named(&issuance, "POST /v1/issuances");
        let webhook_request = named(&webhook, "POST /v1/webhooks/{provider}");
        let verify = named(&webhook, "webhook.verify");
        let process = named(&webhook, "webhook.process");
        let command = webhook
            .iter()
            .find(|s| s.attributes.iter().any(|a| a.key == "db.system.name"))
            .cloned();
        let batch_command = batch.as_ref().and_then(|batch| {
            received
                .lock()
                .unwrap()
                .iter()
                .find(|s| {
                    s.trace_id == batch.trace_id
                        && s.attributes.iter().any(|a| a.key == "db.system.name")
                })
                .cloned()
        });
        if let (
            Some(request),
            Some(webhook_request),
            Some(verify),
            Some(process),
            Some(command),
            Some(batch),
            Some(batch_command),
        ) = (
            request,
            webhook_request,
            verify,
            process,
            command,
            batch,
            batch_command,
        ) {
            // The caller's span is the parent of each request's span.
            assert_eq!(hex(&request.parent_span_id), caller_span);
            assert_eq!(hex(&webhook_request.parent_span_id), caller_span);
            // Verification and processing under the webhook's request, MongoDB under
            // the processing.
            assert_eq!(verify.parent_span_id, webhook_request.span_id);
            assert_eq!(process.parent_span_id, webhook_request.span_id);
            assert_eq!(command.parent_span_id, process.span_id);
            // The batch is a trace of its own, linked to the request's span, and its
            // MongoDB commands are in it.
            assert_ne!(hex(&batch.trace_id), issuance_trace);
            assert!(
                batch
                    .links
                    .iter()
                    .any(|link| link.span_id == request.span_id),
                "the batch links to the request's span"
            );
            assert!(!batch_command.parent_span_id.is_empty());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spans missing after 30 s; received: {:#?}\n{}",
            received
                .lock()
                .unwrap()
                .iter()
                .map(|s| format!(
                    "{} trace={} span={} parent={} links={:?}",
                    s.name,
                    hex(&s.trace_id),
                    hex(&s.span_id),
                    hex(&s.parent_span_id),
                    s.links.iter().map(|l| hex(&l.trace_id)).collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>(),
            service.recent_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn an_endpoint_over_https_or_with_a_query_is_refused_naming_the_key() {
    for endpoint in [
        "https://collector:4318",
        "http://collector:4318/?x=1",
        "collector",
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmint"))
            .arg("verify")
            .env_clear()
            .env("TOKENMINT__TELEMETRY__OTLP_ENDPOINT", endpoint)
            .env("TOKENMINT__MONGO__URI", "mongodb://127.0.0.1:1/")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{endpoint}: {stderr}");
        assert!(
            stderr.contains("telemetry.otlp_endpoint"),
            "{endpoint}: {stderr}"
        );
    }
}
