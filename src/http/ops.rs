//! Operations endpoints: liveness, readiness, Prometheus metrics. No authentication:
//! they reveal nothing about payments or tokens.

use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use crate::server::ShuttingDown;
use crate::store::Store;

/// How long a check that found the database ready answers for. `/readyz` needs no key,
/// so anyone can call it as often as they like: a ready service's database sees at most
/// one check a second however often it is called, where a prober polling every few
/// seconds sees every check fresh.
const READY_FRESH_FOR: Duration = Duration::from_secs(1);

/// The longest a readiness check may take: calls behind it wait for it, so a check stuck
/// on a connection that no longer answers must not hold them for a request's timeout.
/// A probe's own timeout is often a second. As long as the default server selection
/// timeout (`mongo.server_selection_timeout_ms`, 2 s), so a database no server of which
/// can be selected may be told as not answering in time rather than as unreachable:
/// not ready, either way.
const CHECK_AT_MOST: Duration = Duration::from_secs(2);

/// The last readiness check of the database, and when it ended. One check runs at a
/// time: calls that arrive while it runs wait for it and share its answer, so a burst of
/// calls never becomes a burst of commands on the connection pool requests use. A "not
/// ready" is never kept for calls after it: the next call checks again, so a database
/// back from an outage is seen at once.
#[derive(Debug, Default)]
pub struct ReadinessCheck(tokio::sync::Mutex<Option<(Instant, Option<String>)>>);

impl ReadinessCheck {
    /// Why the database is not ready to serve (`None`: ready): the answer of a check that
    /// ended after this call arrived, or of one that found it ready less than
    /// [`READY_FRESH_FOR`] ago, else of a new one.
    async fn reason(&self, store: &Store) -> Option<String> {
        let arrived = Instant::now();
        let mut last = self.0.lock().await;
        if let Some((ended, reason)) = last.as_ref()
            && (*ended >= arrived || (reason.is_none() && ended.elapsed() < READY_FRESH_FOR))
        {
            return reason.clone();
        }
        let reason = tokio::time::timeout(CHECK_AT_MOST, database_not_ready(store))
            .await
            .unwrap_or_else(|_| Some("database did not answer in time".to_owned()));
        *last = Some((Instant::now(), reason.clone()));
        reason
    }
}

/// Why the database is not ready: it does not answer, it does not take writes, or a
/// migration is pending.
async fn database_not_ready(store: &Store) -> Option<String> {
    let writable = store.accepts_writes().await;
    // The gauge says whether MongoDB answers; what it answered is readiness' own.
    crate::telemetry::record_database_up(writable.is_ok());
    match writable {
        Err(_) => Some("database unreachable".to_owned()),
        Ok(false) => Some("database not writable: not a primary".to_owned()),
        Ok(true) => match crate::migrate::pending(store).await {
            Ok(pending) if pending.is_empty() => None,
            Ok(pending) => Some(format!("migrations pending: {}", pending.join(", "))),
            Err(_) => Some("cannot read applied migrations".to_owned()),
        },
    }
}

/// Liveness and readiness answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, `ready` or `unavailable`.
    pub status: &'static str,
    /// Why the service is not ready, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok",
        reason: None,
    })
}

/// Readiness: not shutting down, MongoDB answers as a server that takes writes (a
/// primary, a standalone or a mongos), and every migration is applied. The database is
/// checked one call at a time, and a ready answer stands for a second; shutting down is
/// seen at once.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready to serve", body = Health),
        (status = 503, description = "Shutting down, database unreachable or not writable, or migrations pending", body = Health),
    ))]
pub async fn readyz(
    State(state): State<AppState>,
    shutting_down: Option<Extension<ShuttingDown>>,
) -> impl IntoResponse {
    // Set by the server as soon as shutdown begins, before in-flight requests finish.
    let stopping = || shutting_down.as_ref().is_some_and(|flag| flag.is_set());
    let reason = if stopping() {
        Some("shutting down".to_owned())
    } else {
        let reason = state.readiness.reason(state.issuer.store()).await;
        // The checks take a while when the database is slow: shutdown may have begun.
        reason.or_else(|| stopping().then(|| "shutting down".to_owned()))
    };
    let ready = reason.is_none();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Health {
        status: if ready { "ready" } else { "unavailable" },
        reason,
    };
    (status, axum::Json(body))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
