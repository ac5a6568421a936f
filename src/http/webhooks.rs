//! `POST /v1/webhooks/{provider}`: payment providers' deliveries. Authenticated by the
//! provider's signature over the raw body (no API key), and by its HTTP Basic credentials
//! where they are configured (Adyen); answered 200 for every verified
//! event, including duplicates and events tokenmint ignores, so providers stop retrying.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::Instrument;
use utoipa::ToSchema;
use utoipa_axum::router::{UtoipaMethodRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::PathParams;
use crate::domain::{ClientAddress, EventOutcome};
use crate::telemetry::metric;
use crate::webhooks::{Delivery, ProviderConfig, SignatureHeaders};

/// The answer Adyen requires to a batch it may consider delivered.
pub const ADYEN_ACCEPTED: &str = "[accepted]";

/// The answer to a delivery.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookReceipt {
    pub received: bool,
    /// True when this event id was processed before; nothing was done again.
    pub duplicate: bool,
    #[serde(flatten)]
    pub outcome: EventOutcome,
}

/// Receive a payment provider's event.
///
/// The signature is checked on the raw bytes before anything is parsed, and before the
/// provider's rate limit (failed checks are limited per client address instead), per the
/// provider's configured scheme: Stripe (`Stripe-Signature: t=…,v1=…`), Standard Webhooks
/// (`webhook-id`, `webhook-timestamp`, `webhook-signature`), Paddle
/// (`Paddle-Signature: ts=…;h1=…`) or Adyen (a batch whose every item carries
/// `additionalData.hmacSignature`; one bad item refuses the whole batch; with
/// `basic_auth_username` configured, `Authorization: Basic` is checked before it). Events are
/// deduplicated on (provider, event id); payment state only moves forward (an older event
/// never overwrites a newer one), a canceled or refunded payment never stands again
/// (`terminal`), and a payment's token parameters are the first success's
/// (`metadata_conflict`). A succeeded payment issues the tokens its metadata
/// names; a refund, chargeback, cancellation or failed capture revokes the payment's
/// active tokens, a partial refund the refunded share (that many active tokens, highest
/// tokenIndex first; what redeemed ones leave short is reported as `shortfall`). Events of the other mode than the provider's
/// `livemode` (Stripe's `livemode`, an Adyen batch's `live`) are recorded `ignored`,
/// `livemode_mismatch`. An Adyen batch is answered `[accepted]` (text/plain), as
/// Adyen requires; every other delivery with the JSON receipt.
#[utoipa::path(
    post, path = "/v1/webhooks/{provider}", tag = "webhooks",
    params(
        ("provider" = String, Path, description = "The configured provider name, e.g. `stripe`", example = "stripe"),
        ("Stripe-Signature" = Option<String>, Header, nullable = false, description = "Stripe scheme: `t=<unix>,v1=<hex>`"),
        ("webhook-id" = Option<String>, Header, nullable = false, description = "Standard Webhooks: the event id"),
        ("webhook-timestamp" = Option<String>, Header, nullable = false, description = "Standard Webhooks: unix seconds"),
        ("webhook-signature" = Option<String>, Header, nullable = false, description = "Standard Webhooks: `v1,<base64>` (space-separated)"),
        ("Paddle-Signature" = Option<String>, Header, nullable = false, description = "Paddle scheme: `ts=<unix>;h1=<hex>`"),
        ("Authorization" = Option<String>, Header, nullable = false, description = "`Basic <base64(user:password)>`: required when the provider has `basic_auth_username` configured (scheme `adyen`)"),
    ),
    request_body(content = Object, description = "The provider's event, as sent", content_type = "application/json"),
    responses(
        (status = 200, description = "Accepted (also for duplicates and ignored events): the receipt, or for an Adyen batch the text `[accepted]`",
            content(
                (WebhookReceipt = "application/json"),
                (String = "text/plain", example = "[accepted]"),
            )),
        (status = 400, description = "Signed, but not an event"),
        (status = 401, description = "`basic_auth_invalid` (the provider's HTTP Basic credentials are configured and missing or wrong; checked first), `signature_missing`, `signature_invalid` or `signature_timestamp_out_of_tolerance`"),
        (status = 404, description = "Unknown provider"),
        (status = 413, description = "Body over `webhooks.body_limit_bytes`"),
        (status = 429, description = "`rate_limited`: too many deliveries for this provider, or too many failed signature checks from this address; see Retry-After",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`: retry later"),
    )
)]
pub async fn receive_webhook(
    State(state): State<AppState>,
    client: ClientAddress,
    PathParams(provider): PathParams<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let config = configured(&state, &provider)?;
    let provider = config.name.as_str();
    admit(&state, config, client, &headers)?;
    // Read only now: a caller who names no configured provider, or lacks its
    // credentials, never makes the service buffer a body (the connection is closed after
    // the refusal instead). The body limit is the route's, as for any `Bytes`.
    let body = Bytes::from_request(request, &state)
        .await
        .map_err(unreadable)?;
    let signature_headers = signature_headers(&headers);
    verify(&state, config, client, &signature_headers, &body)?;
    // Only after the signature: only the provider's own deliveries may spend its
    // allowance, so unsigned noise cannot delay its events.
    state.rate_limits.check_provider(provider)?;
    let delivery = config
        .parse(&signature_headers, &body, state.max_quantity)
        .map_err(|malformed| {
            count(provider, "malformed");
            ApiError::MalformedJson(malformed.0)
        })?;
    apply(&state, provider, delivery).await
}

/// The webhook route, reading bodies up to `webhooks.body_limit_bytes` rather than the
/// `server.body_limit_bytes` of every other route (this layer is the inner one, so its
/// limit is the one the body extractor sees). `state` is `None` for the document alone.
pub fn route(state: Option<&AppState>) -> UtoipaMethodRouter<AppState> {
    let route = routes!(receive_webhook);
    match state {
        Some(state) => route.layer(DefaultBodyLimit::max(state.webhook_body_limit)),
        None => route,
    }
}

/// The answer to a body that could not be read: too large, or cut off.
fn unreadable(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge
    } else {
        ApiError::MalformedJson("the body could not be read".to_owned())
    }
}

/// The provider named in the path, if it is configured.
fn configured<'a>(state: &'a AppState, name: &str) -> Result<&'a ProviderConfig, ApiError> {
    state.providers.get(name).ok_or_else(|| {
        // Never the requested name as a label: anyone can invent names.
        count("-", "unknown_provider");
        ApiError::NotFound("No provider of that name is configured.".to_owned())
    })
}

/// The headers any provider's signature scheme may read.
fn signature_headers(headers: &HeaderMap) -> SignatureHeaders<'_> {
    SignatureHeaders {
        stripe_signature: text(headers, "stripe-signature"),
        webhook_id: text(headers, "webhook-id"),
        webhook_timestamp: text(headers, "webhook-timestamp"),
        webhook_signature: text(headers, "webhook-signature"),
        paddle_signature: text(headers, "paddle-signature"),
    }
}

/// The value of the header `name`, when it is present and visible ASCII.
fn text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks the provider's Basic credentials, when it has them: before the body is read
/// and before any HMAC work (they cost a hash to check, the batch's signatures a parse).
/// A refusal is also counted against the client address's allowance of failed checks (a
/// guess at the password is one), which may answer 429 instead.
fn admit(
    state: &AppState,
    config: &ProviderConfig,
    client: ClientAddress,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    if !config.admits(text(headers, "authorization")) {
        count(config.name.as_str(), "credentials_rejected");
        state.rate_limits.check_failed_signature(client)?;
        return Err(ApiError::WebhookCredentials);
    }
    Ok(())
}

/// Checks the provider's signature over the raw body, counted against the client
/// address's allowance of failed checks as [`admit`] does.
fn verify(
    state: &AppState,
    config: &ProviderConfig,
    client: ClientAddress,
    signature_headers: &SignatureHeaders<'_>,
    body: &[u8],
) -> Result<(), ApiError> {
    let provider = config.name.as_str();
    let now = chrono::Utc::now().timestamp();
    let verified = tracing::info_span!("webhook.verify", provider)
        .in_scope(|| config.verify(signature_headers, body, now));
    if let Err(refused) = verified {
        count(provider, "signature_rejected");
        state.rate_limits.check_failed_signature(client)?;
        return Err(ApiError::WebhookSignature(refused));
    }
    Ok(())
}

/// Applies a verified delivery's events and answers as the provider expects: the JSON
/// receipt for one event, `[accepted]` for an Adyen batch.
async fn apply(state: &AppState, provider: &str, delivery: Delivery) -> Result<Response, ApiError> {
    match delivery {
        Delivery::Single(event) => {
            let processed = timed(provider, state.issuer.apply_event(provider, &event)).await?;
            Ok(axum::Json(WebhookReceipt {
                received: true,
                duplicate: processed.duplicate,
                outcome: processed.outcome,
            })
            .into_response())
        }
        // Each item is an event of its own, deduplicated on its own id, in the batch's
        // order. A failure stops the batch unanswered (503): Adyen sends it again, and
        // the items already applied are duplicates then.
        Delivery::Batch(events) => {
            for event in &events {
                timed(provider, state.issuer.apply_event(provider, event)).await?;
            }
            Ok((
                [(CONTENT_TYPE, "text/plain; charset=utf-8")],
                ADYEN_ACCEPTED,
            )
                .into_response())
        }
    }
}

/// Runs one event's processing in a span of its own, recording how long it took
/// (failures too: a slow 503 is what an operator looks for).
async fn timed<T>(provider: &str, processing: impl Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let result = processing
        .instrument(tracing::info_span!("webhook.process", provider))
        .await;
    metrics::histogram!(metric::WEBHOOK_PROCESSING_DURATION_SECONDS, "provider" => provider.to_owned())
        .record(started.elapsed().as_secs_f64());
    result
}

/// Counts a delivery refused before processing; `provider` is a configured name or `-`.
fn count(provider: &str, outcome: &'static str) {
    metrics::counter!(metric::WEBHOOK_EVENTS_TOTAL, "provider" => provider.to_owned(), "outcome" => outcome)
        .increment(1);
}
