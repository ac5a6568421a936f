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
mod problem_types;
mod problems;
mod rate_limit;
mod redemptions;
mod tokens;
mod webhooks;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::issuing::Issuer;
use crate::settings::Settings;
use crate::webhooks::Providers;
use auth::ApiKeys;
use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The issuing service: every rule, and the store underneath it.
    pub issuer: Issuer,
    pub keys: Arc<ApiKeys>,
    pub providers: Arc<Providers>,
    pub rate_limits: Arc<rate_limit::RateLimits>,
    pub max_quantity: u32,
    /// `webhooks.body_limit_bytes`: the webhook route's own body limit.
    pub webhook_body_limit: usize,
    /// `server.trusted_proxies`: whose `X-Forwarded-For` names the client address.
    pub trusted_proxies: Arc<[ipnet::IpNet]>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// `/readyz`'s last look at the database, shared by every call.
    pub(crate) readiness: Arc<ops::ReadinessCheck>,
}

impl AppState {
    pub fn new(issuer: Issuer, keys: ApiKeys, providers: Providers, settings: &Settings) -> Self {
        Self {
            issuer,
            keys: Arc::new(keys),
            providers: Arc::new(providers),
            rate_limits: Arc::new(rate_limit::RateLimits::new(&settings.rate_limit)),
            max_quantity: settings.issuance.max_quantity,
            webhook_body_limit: settings.webhooks.body_limit_bytes,
            trusted_proxies: settings.server.trusted_proxies.clone().into(),
            metrics: crate::telemetry::metrics_handle(),
            readiness: Arc::default(),
        }
    }
}

/// The whole application: routes, then the layers every request goes through.
pub fn router(state: AppState, settings: &Settings) -> Router {
    let metrics_here = settings.server.metrics_bind.is_none();
    // This table's own document is not served: `/openapi.json` is the whole document, as
    // `openapi.yaml` is, `/metrics` included wherever it is served.
    let (routes, _) = route_table(Some(&state), metrics_here).split_for_parts();
    let routes = routes
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

/// Every documented route, each written once: its `#[utoipa::path]` gives both the route
/// and its part of the OpenAPI document. `state` is `None` when only the document is
/// wanted (the layers need it, the document does not); `/metrics` is left out where it has
/// a listener of its own (`metrics_here` false), and documented all the same.
fn route_table(state: Option<&AppState>, metrics_here: bool) -> OpenApiRouter<AppState> {
    let retried = |route, scope| idempotency::answering_retries(route, state, scope);
    let mut table = OpenApiRouter::with_openapi(openapi::Base::openapi())
        .routes(routes!(issuances::create_issuance))
        .routes(routes!(issuances::get_issuance))
        .routes(routes!(tokens::list_tokens))
        .routes(routes!(tokens::get_token))
        .routes(retried(routes!(tokens::redeem_token), tokens::REDEEM_SCOPE))
        .routes(retried(routes!(tokens::revoke_token), tokens::REVOKE_SCOPE))
        .routes(retried(
            routes!(tokens::transfer_token),
            tokens::TRANSFER_SCOPE,
        ))
        .routes(routes!(balances::get_balances))
        .routes(retried(
            routes!(redemptions::create_redemption),
            redemptions::CREATE_SCOPE,
        ))
        .routes(routes!(redemptions::get_redemption))
        .routes(routes!(payments::get_payment))
        .routes(webhooks::route(state))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(problem_types::problem_type));
    if metrics_here {
        table = table.routes(routes!(ops::metrics));
    }
    openapi::complete(table.get_openapi_mut());
    table
}

/// The OpenAPI document: `openapi::Base` with every route of the route table.
pub struct ApiDoc;

impl OpenApi for ApiDoc {
    fn openapi() -> utoipa::openapi::OpenApi {
        route_table(None, true).into_openapi()
    }
}

/// What the metrics listener (`server.metrics_bind`) serves: `/metrics`, and 404 for
/// anything else. No middleware: it is for the scraper, not for clients.
pub fn metrics_router(state: AppState) -> Router {
    let (metrics, _) = OpenApiRouter::new()
        .routes(routes!(ops::metrics))
        .split_for_parts();
    metrics
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
