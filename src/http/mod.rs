//! The HTTP surface: one route table, one error envelope, one OpenAPI document.

pub mod auth;
pub mod error;
mod extract;
mod issuances;
mod middleware;
mod ops;
mod payment_path;
mod payments;
mod prefer;
mod problems;
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
        description = "Issues tokens for payments, exactly once per payment.\n\n\
HTTP conventions, on every operation:\n\n\
- Every error is `application/problem+json` (RFC 9457) with a stable `code`; its `type`, \
`/problems/{code}`, resolves: `GET /problems/{code}` describes it.\n\
- Every 401 carries `WWW-Authenticate`: `Bearer realm=\"tokenmint\"` for API keys \
(RFC 6750), with `error=\"invalid_token\"` when a key was presented but is unknown; \
`Signature realm=\"webhooks\", error=\"<code>\"` for webhook deliveries, which are \
authenticated by the provider's signature over the raw body (`Stripe-Signature`, or \
Standard Webhooks' `webhook-id`, `webhook-timestamp` and `webhook-signature`) instead.\n\
- A known path with a method it does not support answers 405 `method_not_allowed` with \
an `Allow` header listing the methods it does; an unknown path answers 404 `not_found`.\n\
- `If-Match` uses RFC 9110's strong comparison: `W/\"3\"` never matches, `*` matches any \
version of an existing token, a list matches if any entry does.\n\
- `Retry-After` (429, 503) is a whole number of seconds, rounded up.",
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
        problems::problem_type,
    ),
    modifiers(&BearerAuth, &HttpConventions),
    tags(
        (name = "issuances", description = "Issue a payment's tokens exactly once"),
        (name = "tokens", description = "Read tokens and change their state through the version gate"),
        (name = "payments", description = "Payment state as reported by providers"),
        (name = "webhooks", description = "Deliveries from payment providers"),
        (name = "operations", description = "Health, readiness, metrics"),
        (name = "problems", description = "What each problem `type` (`/problems/{code}`) means"),
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

/// Documents the headers every operation's answers share, without repeating them in
/// each annotation: `WWW-Authenticate` on every 401 (the bearer challenge, or the
/// signature challenge for webhook deliveries), and `Retry-After` as whole seconds.
struct HttpConventions;

impl utoipa::Modify for HttpConventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{Object, Type};
        use utoipa::openapi::{HeaderBuilder, RefOr};

        let header = |schema: Type, description: String| {
            RefOr::T(
                HeaderBuilder::new()
                    .schema(Some(Object::with_type(schema)))
                    .description(Some(description))
                    .build(),
            )
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let challenge = if path.starts_with("/v1/webhooks/") {
                format!(
                    "`{}, error=\"<code>\"`: sign the raw body with the provider's configured scheme",
                    error::WEBHOOK_SIGNATURE_CHALLENGE
                )
            } else {
                format!(
                    "`Bearer realm=\"{realm}\"`, or `Bearer realm=\"{realm}\", error=\"invalid_token\"` when the key presented is unknown",
                    realm = error::API_KEY_REALM
                )
            };
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                for (status, response) in operation.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if status == "401" {
                        response.headers.insert(
                            "WWW-Authenticate".to_owned(),
                            header(Type::String, challenge.clone()),
                        );
                    }
                    if let Some(retry_after) = response.headers.get_mut("Retry-After") {
                        *retry_after = header(
                            Type::Integer,
                            "Whole seconds to wait, rounded up (at least 1)".to_owned(),
                        );
                    }
                }
            }
        }
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
        .merge(problems::router())
        .merge(swagger_ui())
        .fallback(|| async { ApiError::NotFound("No such resource.".to_owned()) })
        // Applies to every route registered above. axum's MethodRouter adds the `Allow`
        // header (the methods the path has, e.g. `GET,HEAD`) to what this answers.
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(settings.server.body_limit_bytes))
        .with_state(state);
    middleware::apply(routes, settings)
}

/// `/docs`, served entirely from this process: the online spec validator Swagger UI
/// calls by default (validator.swagger.io) is off, so the page requests no other host.
fn swagger_ui() -> SwaggerUi {
    SwaggerUi::new("/docs")
        .url("/openapi.json", ApiDoc::openapi())
        .config(utoipa_swagger_ui::Config::default().validator_url("none"))
}
