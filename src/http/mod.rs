//! The HTTP surface: one route table, one error envelope, one OpenAPI document.

pub mod auth;
pub mod error;
mod extract;
mod issuances;
mod middleware;
mod ops;
mod payment_path;
mod payments;
mod rate_limit;
mod tokens;
mod webhooks;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
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
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
}

impl AppState {
    pub fn new(issuer: Issuer, keys: ApiKeys, settings: &Settings) -> Self {
        Self {
            issuer,
            keys: Arc::new(keys),
            providers: Arc::new(Providers::from_settings(&settings.providers)),
            rate_limits: Arc::new(rate_limit::RateLimits::new(&settings.rate_limit)),
            max_quantity: settings.issuance.max_quantity,
            metrics: crate::telemetry::metrics_handle(),
        }
    }
}

/// The OpenAPI document, generated from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tokenmint",
        description = "Issues tokens for payments, exactly once per payment.",
        license(name = "MIT")
    ),
    paths(
        issuances::create_issuance,
        issuances::get_issuance,
        tokens::get_token,
        tokens::list_tokens,
        tokens::redeem_token,
        tokens::revoke_token,
        tokens::transfer_token,
        payments::get_payment,
        webhooks::receive_webhook,
        ops::healthz,
        ops::readyz,
        ops::metrics,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "issuances", description = "Issue a payment's tokens exactly once"),
        (name = "tokens", description = "Read tokens and change their state through the version gate"),
        (name = "payments", description = "Payment state as reported by providers"),
        (name = "webhooks", description = "Deliveries from payment providers"),
        (name = "operations", description = "Health, readiness, metrics"),
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme the handlers reference.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The whole application: routes, then the layers every request goes through.
pub fn router(state: AppState, settings: &Settings) -> Router {
    let routes = Router::new()
        .merge(issuances::router())
        .merge(tokens::router())
        .merge(payments::router())
        .merge(webhooks::router())
        .merge(ops::router())
        .merge(SwaggerUi::new("/docs").url("/openapi.json", ApiDoc::openapi()))
        .fallback(|| async { ApiError::NotFound("No such resource.".to_owned()) })
        .method_not_allowed_fallback(|| async {
            ApiError::NotFound("No such resource for this method.".to_owned())
        })
        .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes))
        .with_state(state);
    middleware::apply(routes, settings)
}
