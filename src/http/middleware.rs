//! What wraps every request: a request id and the API key id (on every log line), an
//! access log, HTTP metrics by route template, a per-request timeout answered as
//! problem+json, a panic guard, and CORS for the configured checkout origins only. The id,
//! the span and the access log are tower-http's layers (`request-id`, `trace`), told
//! which ids to keep and what to log; `Authorization` is marked sensitive for every layer.
//!
//! Anyone can send any method token and any path, with no key: metric labels come only
//! from closed sets (`method_label`, route templates, status codes) and log fields carry
//! at most `telemetry::Bounded::LIMIT` bytes of what the client wrote.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{Next, from_fn, map_request};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

use super::error::ApiError;
use super::idempotency::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use super::prefer::{PREFER, PREFERENCE_APPLIED};
use super::rate_limit::{RATE_LIMIT, RATE_LIMIT_POLICY};
use crate::settings::Settings;
use crate::telemetry::{Bounded, metric, traces};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Wraps `router` in the layers every request goes through.
pub fn apply(router: Router, settings: &Settings) -> Router {
    let timeout = settings.request_timeout();
    router
        // A layer, not a route layer: the fallback (no route: 404 `unmatched`) is counted too.
        .layer(from_fn(record_metrics))
        .layer(from_fn(move |req: Request, next: Next| {
            with_timeout(timeout, req, next)
        }))
        // A bug that panics in a handler answers 500 problem+json (logged), instead of a
        // dropped connection the client would have to guess about. Inside CORS: that
        // answer gets the CORS headers too, or a browser would hide it from the page.
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("handler panicked");
            ApiError::Internal.into_response()
        }))
        .layer(cors(&settings.server.cors_origins))
        // The request's span and access log line, and nothing else (tower-http's own
        // request, body and failure events are off: the access log says it all).
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(log_completed)
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        // A client's sane id is kept, any other replaced by a fresh one, and it is echoed
        // on the response.
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(map_request(forget_insane_request_id))
        // Outermost, so that no layer's or handler's `Debug` of the headers shows an API
        // key or a webhook's Basic password.
        .layer(SetSensitiveRequestHeadersLayer::new(SENSITIVE))
}

/// The request headers that carry secrets: API keys and Basic credentials.
const SENSITIVE: [HeaderName; 1] = [header::AUTHORIZATION];

/// Forgets a client's `x-request-id` unless it is sane (1–128 visible characters from a
/// safe set), so that `SetRequestIdLayer` makes a fresh one instead: the id goes on every
/// log line of the request and back to the client.
async fn forget_insane_request_id(mut req: Request) -> Request {
    // Absent is fine (a fresh one is made); present, it must be text and sane: bytes
    // that are not visible ASCII would otherwise be kept, echoed, and logged as "".
    let sane = req
        .headers()
        .get(&REQUEST_ID)
        .is_none_or(|v| v.to_str().is_ok_and(is_sane_request_id));
    if !sane {
        req.headers_mut().remove(&REQUEST_ID);
    }
    req
}

/// The span the request runs in, carrying its id; continues the client's trace
/// (`traceparent`), if it sent one.
fn request_span(req: &Request) -> tracing::Span {
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // `key_id` is filled in once the API key is known (`auth`), so every line the
    // request logs from then on, and its access log line, says who asked.
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %Bounded(req.method().as_str()),
        path = %Bounded(req.uri().path()),
        key_id = tracing::field::Empty,
        otel.kind = "server",
        http.response.status_code = tracing::field::Empty,
    );
    traces::continue_trace(&span, req.headers());
    span
}

/// The access log line, inside the request's span.
fn log_completed<B>(response: &Response<B>, latency: Duration, span: &tracing::Span) {
    span.record("http.response.status_code", response.status().as_u16());
    tracing::info!(
        status = response.status().as_u16(),
        latency_ms = latency.as_secs_f64() * 1000.0,
        "request completed"
    );
}

fn is_sane_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// More time a request has earned: the wait an issuance spends on its payment's event
/// (`Prefer: wait=N`), granted once the issuer holds it waiting (its key and body
/// accepted, a place given, its answer pending), and added once to the request's timeout.
#[derive(Debug, Clone, Default)]
pub struct WaitAllowance(Arc<AtomicU64>);

impl WaitAllowance {
    /// Allows `wait` on top of the request timeout (the last grant counts).
    pub fn grant(&self, wait: Duration) {
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.0.store(millis, Ordering::Relaxed);
    }

    /// The allowance not yet spent, spending it.
    fn take(&self) -> Option<Duration> {
        let millis = self.0.swap(0, Ordering::Relaxed);
        (millis > 0).then(|| Duration::from_millis(millis))
    }
}

/// Answers 503 `request_timeout` when the handler runs past `server.request_timeout_ms`,
/// plus the wait its handler granted (`WaitAllowance`): waiting for a payment's event is
/// not work, and must not turn into a 503. Only a request that waits is granted it — a
/// client that names a wait and then trickles its body, whose key or body is refused,
/// that gets no place or is answered at once has the ordinary timeout, so naming a wait
/// neither holds a connection nor lets slow work outlast the timeout.
async fn with_timeout(timeout: Duration, mut req: Request, next: Next) -> Response {
    let allowance = WaitAllowance::default();
    req.extensions_mut().insert(allowance.clone());
    let run = next.run(req);
    tokio::pin!(run);
    let started = tokio::time::Instant::now();
    let mut deadline = started + timeout;
    loop {
        match tokio::time::timeout_at(deadline, &mut run).await {
            Ok(response) => return response,
            Err(_) => match allowance.take() {
                Some(wait) => deadline += wait,
                None => {
                    let ran = started.elapsed().as_millis() as u64;
                    tracing::warn!(timeout_ms = ran, "request timed out");
                    return ApiError::Timeout.into_response();
                }
            },
        }
    }
}

/// Counts requests and observes latency by route template (never the raw path, whose
/// ids would make unbounded label values) and by `method_label` (never the raw method,
/// which a client may make up).
async fn record_metrics(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(req.method()).to_owned();
    traces::rename(&tracing::Span::current(), || format!("{method} {route}"));
    let started = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!(metric::HTTP_REQUESTS_TOTAL, &labels).increment(1);
    metrics::histogram!(metric::HTTP_REQUEST_DURATION_SECONDS, &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

/// The `method` label: one of the nine methods of RFC 9110 and PATCH, else `other`. Each
/// label value is a series kept for the process's life, so a made-up token (hyper accepts
/// any, up to its header buffer) must not become one.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// Browsers may call only from `origins`; others get no CORS headers at all.
fn cors(origins: &[String]) -> CorsLayer {
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::IF_MATCH,
            IDEMPOTENCY_KEY,
            PREFER,
            REQUEST_ID,
        ])
        .expose_headers([
            header::ETAG,
            header::LOCATION,
            header::RETRY_AFTER,
            // A checkout page reads its address's allowance (it is the browser's).
            RATE_LIMIT_POLICY,
            RATE_LIMIT,
            REQUEST_ID,
            IDEMPOTENT_REPLAYED,
            HeaderName::from_static(PREFERENCE_APPLIED),
        ])
        .max_age(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use tower_service::Service;

    use super::*;

    /// A handler's panic is answered 500 problem+json with the CORS headers every other
    /// answer to an allowed origin gets: without them a checkout page could not read the
    /// answer (nor its `x-request-id`, to quote to support), only see the call fail.
    #[tokio::test]
    async fn a_panic_is_answered_with_the_cors_headers() {
        let origin = "https://shop.example";
        let settings =
            Settings::with_overrides(&[&format!("[server]\ncors_origins = [\"{origin}\"]\n")])
                .expect("settings");
        async fn buggy() -> &'static str {
            panic!("a bug")
        }
        let routes = Router::new().route("/boom", get(buggy));
        let request = Request::builder()
            .uri("/boom")
            .header(header::ORIGIN, origin)
            .body(Body::empty())
            .unwrap();
        let response = apply(routes, &settings).call(request).await.unwrap();
        assert_eq!(response.status(), 500);
        assert_eq!(
            response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            origin
        );
        let exposed = response.headers()[header::ACCESS_CONTROL_EXPOSE_HEADERS]
            .to_str()
            .unwrap();
        assert!(exposed.contains("x-request-id"), "{exposed}");
        assert!(response.headers().contains_key(REQUEST_ID));
    }

    /// An `x-request-id` that is not visible ASCII is replaced by a fresh id, never kept:
    /// kept, it would be echoed as sent and logged as an empty id, so a client could
    /// make its requests untraceable.
    #[tokio::test]
    async fn a_request_id_that_is_not_text_is_replaced() {
        let settings = Settings::with_overrides(&[]).expect("settings");
        let routes = Router::new().route("/x", get(|| async { "ok" }));
        for sent in [&b"\xff\xfe"[..], b"two words", b""] {
            let request = Request::builder()
                .uri("/x")
                .header(REQUEST_ID, HeaderValue::from_bytes(sent).unwrap())
                .body(Body::empty())
                .unwrap();
            let response = apply(routes.clone(), &settings)
                .call(request)
                .await
                .unwrap();
            let answered = response.headers()[REQUEST_ID].as_bytes();
            assert_ne!(answered, sent);
            let answered = std::str::from_utf8(answered).unwrap();
            assert!(uuid::Uuid::parse_str(answered).is_ok(), "{answered}");
        }
    }
}
