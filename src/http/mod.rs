//! The HTTP surface: one route table, one error envelope, one OpenAPI document.

pub mod auth;
mod balances;
mod client_address;
pub mod error;
mod extract;
mod idempotency;
mod issuances;
mod middleware;
mod openapi;
mod ops;
mod payment_path;
mod payments;
mod prefer;
mod problems;
mod rate_limit;
mod redemptions;
mod tokens;
mod webhooks;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa::OpenApi;
use utoipa_swagger_ui::SwaggerUi;

use crate::issuing::Issuer;
use crate::settings::Settings;
use crate::webhooks::Providers;
use auth::ApiKeys;
use error::ApiError;
pub use openapi::ApiDoc;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The issuing service: every rule, and the store underneath it.
    pub issuer: Issuer,
    pub keys: Arc<ApiKeys>,
    pub providers: Arc<Providers>,
    pub rate_limits: Arc<rate_limit::RateLimits>,
    pub max_quantity: u32,
    /// `server.trusted_proxies`: whose `X-Forwarded-For` names the client address.
    pub trusted_proxies: Arc<[ipnet::IpNet]>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
}

impl AppState {
    pub fn new(issuer: Issuer, keys: ApiKeys, providers: Providers, settings: &Settings) -> Self {
        Self {
            issuer,
            keys: Arc::new(keys),
            providers: Arc::new(providers),
            rate_limits: Arc::new(rate_limit::RateLimits::new(&settings.rate_limit)),
            max_quantity: settings.issuance.max_quantity,
            trusted_proxies: settings.server.trusted_proxies.clone().into(),
            metrics: crate::telemetry::metrics_handle(),
        }
    }
}

/// The whole application: routes, then the layers every request goes through.
pub fn router(state: AppState, settings: &Settings) -> Router {
    let routes = Router::new()
        .merge(issuances::router())
        .merge(tokens::router(&state))
        .merge(balances::router())
        .merge(redemptions::router(&state))
        .merge(payments::router())
        .merge(webhooks::router())
        .merge(ops::router(settings))
        .merge(problems::router())
        .merge(swagger_ui())
        .fallback(|| async { ApiError::NotFound("No such resource.".to_owned()) })
        // Applies to every route registered above. axum's MethodRouter adds the `Allow`
        // header (the methods the path has, e.g. `GET,HEAD`) to what this answers.
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes))
        .layer(axum::middleware::from_fn(rate_limit::note_limits))
        .with_state(state);
    middleware::apply(routes, settings)
}

/// What the metrics listener (`server.metrics_bind`) serves: `/metrics`, and 404 for
/// anything else. No middleware: it is for the scraper, not for clients.
pub fn metrics_router(state: AppState) -> Router {
    ops::metrics_router()
        .fallback(|| async { ApiError::NotFound("Only /metrics is served here.".to_owned()) })
        .with_state(state)
}

/// `/docs`, served entirely from this process: the online spec validator Swagger UI
/// calls by default (validator.swagger.io) is off, so the page requests no other host.
fn swagger_ui() -> SwaggerUi {
    SwaggerUi::new("/docs")
        .url("/openapi.json", ApiDoc::openapi())
        .config(utoipa_swagger_ui::Config::default().validator_url("none"))
}
