//! `/v1/issuances`: issue a payment's tokens exactly once, and read an issuance back.
//! A checkout may ask to wait for its payment's event with `Prefer: wait=N` (RFC 7240):
//! the header is read by `prefer`, whether and how long it waits is decided in `issuing`.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, UNKNOWN_PROVIDER};
use super::extract::{JsonBody, PathParams};
use super::idempotency::IDEMPOTENT_REPLAYED;
use super::middleware::WaitAllowance;
use super::payment_path::PaymentPath;
use super::prefer::{PREFERENCE_APPLIED, preferred_wait};
use crate::domain::{
    AccountId, Actor, ClientAddress, FieldErrors, IssuanceMode, IssuanceParams, IssuanceStatus,
    NewIssuance, Owner, PaymentIntentId, PaymentKey, Provider, Quantity, Scope, TokenStatus,
    TokenType,
};
use crate::issuing::{Caller, IssueOutcome, IssuedTokens};
use crate::store::{TokenSummary, chrono_time};
use crate::telemetry::metric;

/// Body of `POST /v1/issuances`. Fields are parsed into domain types all at once so that
/// every bad field is reported in one 422.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuanceRequest {
    /// Payment provider, `^[a-z][a-z0-9_-]{0,31}$`.
    #[schema(value_type = String, required = true, example = "stripe")]
    provider: Option<Value>,
    /// Merchant account at the provider, `^[A-Za-z0-9_.:-]{1,64}$`; default `default`.
    #[schema(value_type = Option<String>, required = false, example = "acct_1")]
    account_id: Option<Value>,
    /// The provider's payment id, `^[A-Za-z0-9_.:-]{1,128}$`.
    #[schema(value_type = String, required = true, example = "pi_123")]
    payment_intent_id: Option<Value>,
    /// Owner of the tokens: 24-hex ObjectId.
    #[schema(value_type = String, required = true, example = "65f1a0c2b3d4e5f601234567")]
    owner: Option<Value>,
    /// `^[a-z0-9][a-z0-9_.-]{0,63}$`.
    #[schema(value_type = String, required = true, example = "standard")]
    token_type: Option<Value>,
    /// Integer from 1 to `issuance.max_quantity` (configurable, default 1000, at most 10 000).
    #[schema(value_type = i64, required = true, minimum = 1, maximum = 10000, example = 4)]
    quantity: Option<Value>,
    /// RFC 3339; default now. Set on the first write only, never compared on retry. A
    /// checkout key's stands on its pending request only (and is answered back in the
    /// 202): the tokens carry the provider's payment date (or the trusted backend's,
    /// when that issues them).
    #[schema(value_type = Option<String>, required = false, format = DateTime)]
    payment_date: Option<Value>,
    /// `upsert` or `atomic`; default `issuance.default_mode`. A checkout key's is
    /// checked, and stands on its pending request only: the issuance that fulfils it
    /// runs in the provider's (the default) or the trusted backend's mode.
    #[schema(value_type = Option<IssuanceMode>, required = false)]
    mode: Option<Value>,
}

impl IssuanceRequest {
    /// Validates every field, reporting all bad ones together with `errors` (the body's
    /// unknown fields); `may_name` says which providers the caller may name.
    fn into_domain(
        self,
        mut errors: FieldErrors,
        max_quantity: u32,
        default_mode: IssuanceMode,
        requested_by: Actor,
        may_name: impl Fn(&Provider) -> bool,
    ) -> Result<NewIssuance, ApiError> {
        let provider = errors.required_text("provider", self.provider.as_ref(), Provider::parse);
        if provider
            .as_ref()
            .is_some_and(|provider| !may_name(provider))
        {
            errors.push("provider", UNKNOWN_PROVIDER);
        }
        let account_id = errors
            .optional_text("accountId", self.account_id.as_ref(), AccountId::parse)
            .map(Option::unwrap_or_default);
        let payment_intent_id = errors.required_text(
            "paymentIntentId",
            self.payment_intent_id.as_ref(),
            PaymentIntentId::parse,
        );
        let owner = errors.required_text("owner", self.owner.as_ref(), Owner::parse);
        let token_type =
            errors.required_text("tokenType", self.token_type.as_ref(), TokenType::parse);
        let quantity = errors.required(
            "quantity",
            self.quantity
                .as_ref()
                .filter(|q| !q.is_null())
                .map(|q| Quantity::from_json(q, max_quantity)),
        );
        let payment_date = errors
            .optional_text("paymentDate", self.payment_date.as_ref(), parse_rfc3339)
            .map(|date| date.unwrap_or_else(Utc::now));
        let mode = errors
            .optional_text("mode", self.mode.as_ref(), IssuanceMode::parse)
            .map(|mode| mode.unwrap_or(default_mode));
        let key = match (provider, account_id, payment_intent_id) {
            (Some(provider), Some(account_id), Some(payment_intent_id)) => Some(PaymentKey {
                provider,
                account_id,
                payment_intent_id,
            }),
            _ => None,
        };
        errors.finish().map_err(ApiError::Validation)?;
        match (key, owner, token_type, quantity, payment_date, mode) {
            (
                Some(key),
                Some(owner),
                Some(token_type),
                Some(quantity),
                Some(payment_date),
                Some(mode),
            ) => Ok(NewIssuance {
                key,
                params: IssuanceParams {
                    owner,
                    token_type,
                    quantity,
                },
                payment_date,
                mode,
                requested_by,
            }),
            // Unreachable: every None above recorded an error.
            _ => Err(ApiError::Internal),
        }
    }
}

fn parse_rfc3339(value: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(value)
        .map(|d| d.with_timezone(&Utc))
        .map_err(|_| "must be an RFC 3339 date-time, e.g. 2026-09-01T00:00:00Z".to_owned())
}

/// An issuance record as clients see it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceView {
    pub id: String,
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub owner: String,
    pub token_type: String,
    pub quantity: i64,
    pub payment_date: DateTime<Utc>,
    pub mode: IssuanceMode,
    pub status: IssuanceStatus,
    pub created_at: DateTime<Utc>,
}

/// One token of an issuance.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRef {
    pub id: String,
    pub token_index: i64,
    pub status: TokenStatus,
    pub version: i64,
}

/// An issuance with its tokens in tokenIndex order.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceResponse {
    pub issuance: IssuanceView,
    pub tokens: Vec<TokenRef>,
    /// How many tokens this request inserted (absent on reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<u32>,
}

impl IssuanceResponse {
    fn new(issued: IssuedTokens, with_created: bool) -> Self {
        let i = issued.issuance;
        Self {
            issuance: IssuanceView {
                id: i.id.to_hex(),
                provider: i.provider,
                account_id: i.account_id,
                payment_intent_id: i.payment_intent_id,
                owner: i.owner.to_hex(),
                token_type: i.token_type,
                quantity: i.quantity,
                payment_date: chrono_time(i.payment_date),
                mode: i.mode,
                status: i.status,
                created_at: chrono_time(i.created_at),
            },
            tokens: issued.tokens.into_iter().map(TokenRef::from).collect(),
            created: with_created.then_some(issued.created),
        }
    }

    fn location(&self) -> String {
        let i = &self.issuance;
        format!(
            "/v1/issuances/{}/{}/{}",
            i.provider, i.account_id, i.payment_intent_id
        )
    }
}

impl From<TokenSummary> for TokenRef {
    fn from(t: TokenSummary) -> Self {
        Self {
            id: t.id.to_hex(),
            token_index: t.token_index,
            status: t.status,
            version: t.version,
        }
    }
}

/// Issue a payment's tokens, exactly once.
///
/// The first request for a payment writes the issuance and its tokens (201). An identical
/// retry answers 200 with `Idempotent-Replayed: true` and the same token ids, completing a
/// partial issuance if a crash interrupted the first. A request whose owner, tokenType or
/// quantity differs from the recorded issuance is refused with 409 and writes nothing, and
/// so is any request for a payment the provider reported failed, canceled or refunded.
/// A checkout key (`issuances:request`) issues only once the provider reported the payment
/// succeeded with the same parameters; before that it gets 202 and a pending issuance that
/// the success webhook fulfils (with the provider's parameters, which outrank the request).
///
/// A checkout key may send `Prefer: wait=N` (seconds, at most 30): a request that would be
/// answered 202 is then held until the payment's provider event has been applied (by any
/// instance) or N seconds passed, and answered what it gets then — 201/200 with the
/// tokens, 409, or still 202 — with `Preference-Applied: wait=N` when it waited. Places to
/// wait are bounded per instance and per client address; without one the request is
/// answered at once, without `Preference-Applied`. A trusted key issues at once: the
/// preference is ignored for it.
///
/// A checkout key is public (it ships to browsers), so its requests are rate limited per
/// client address rather than per key (`rate_limit.per_address_*`): the peer's address, or
/// from a proxy in `server.trusted_proxies` the right-most untrusted `X-Forwarded-For`
/// hop; IPv6 by /64.
///
/// Mode `atomic` needs MongoDB transactions: on a deployment without them it answers 503
/// `transactions_unavailable` (issue in mode `upsert` instead).
#[utoipa::path(
    post,
    path = "/v1/issuances",
    tag = "issuances",
    request_body = IssuanceRequest,
    params(
        ("Prefer" = Option<String>, Header, nullable = false, example = "wait=10",
            description = "RFC 7240. `wait=N`: a checkout key's pending request waits up to N seconds (at most 30; the request's timeout is extended by the wait) for the payment's provider event. Ignored for trusted keys; other or malformed preferences are ignored."),
    ),
    security(("bearer" = ["issuances:write"]), ("bearer" = ["issuances:request"])),
    responses(
        (status = 201, description = "Issued now", body = IssuanceResponse,
            headers(
                ("Location" = String, description = "The issuance's GET URL"),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited for the payment's event"),
            )),
        (status = 200, description = "Replay of an earlier identical request", body = IssuanceResponse,
            headers(
                ("Idempotent-Replayed" = String, description = "`true`"),
                ("Location" = String, description = "The issuance's GET URL"),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited for the payment's event"),
            )),
        (status = 202, description = "Pending: a checkout key's request, fulfilled by the payment's success webhook (with `Prefer: wait=N`: still pending after N seconds, or no place to wait was free — `issuance.max_waiters` on the instance, `issuance.max_waiters_per_address` from this client address — and it was answered at once, without `Preference-Applied`)", body = IssuanceResponse,
            headers(
                ("Location" = String, description = "The issuance's GET URL"),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited for the payment's event"),
            )),
        (status = 409, description = "`idempotency_conflict`: the payment was issued with other parameters (`mismatches` names the fields, with both values; a checkout key is told neither); `payment_not_succeeded`: the provider reported the payment failed, canceled or refunded; `state_conflict`: a checkout key asked for a payment only a trusted backend can issue",
            headers(("Preference-Applied" = String, description = "`wait=N` when the request waited for the payment's event"))),
        (status = 422, description = "`validation_failed`, every bad field listed (a checkout key may only name a configured provider)"),
        (status = 503, description = "`database_unavailable` or `request_timeout`: retry after Retry-After; `transactions_unavailable` (no Retry-After): atomic mode on a MongoDB without transactions, which a retry does not change (issue in mode `upsert`)",
            headers(("Retry-After" = u64, description = "With `database_unavailable` and `request_timeout`"))),
    )
)]
pub async fn create_issuance(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    client: ClientAddress,
    Extension(allowance): Extension<WaitAllowance>,
    headers: HeaderMap,
    body: Result<JsonBody<IssuanceRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let caller = if principal.has(Scope::IssuancesWrite) {
        Caller::Trusted
    } else {
        principal.require(Scope::IssuancesRequest)?;
        Caller::Checkout
    };
    // The body is judged only once the caller may send one: a key without the scope
    // hears 403, whatever it sent.
    let JsonBody(body, errors) = body?;
    let request = body.into_domain(
        errors,
        state.max_quantity,
        state.issuer.default_mode(),
        Actor::api_key(&principal.key_id),
        |provider| state.issuer.may_name_provider(caller, provider),
    )?;
    principal.require_account(&request.key)?;
    // The wait, once the issuer holds the request (its key and body accepted, a place
    // given, the answer pending), is added to the request timeout: waiting is not work.
    let answer = state
        .issuer
        .issue_waiting(caller, &request, preferred_wait(&headers), client, |wait| {
            allowance.grant(wait)
        })
        .await;
    let mut response = match answer.result {
        Ok(outcome) => issued_response(outcome),
        Err(err) => {
            if let crate::issuing::IssueError::Conflict(_) = err {
                metrics::counter!(metric::ISSUANCES_TOTAL, "outcome" => "conflict").increment(1);
            }
            ApiError::from(err).into_response()
        }
    };
    if let Some(secs) = answer.waited_secs {
        response.headers_mut().insert(
            PREFERENCE_APPLIED,
            HeaderValue::from_str(&format!("wait={secs}")).expect("digits are a header value"),
        );
    }
    Ok(response)
}

/// The answer to an issuance that went through: 201, 200 (a replay) or 202 (pending).
fn issued_response(outcome: IssueOutcome) -> Response {
    let (status, issued, label) = match outcome {
        IssueOutcome::Created(issued) => (StatusCode::CREATED, issued, "created"),
        IssueOutcome::Replayed(issued) => (StatusCode::OK, issued, "replayed"),
        IssueOutcome::Pending(issued) => (StatusCode::ACCEPTED, issued, "pending"),
    };
    metrics::counter!(metric::ISSUANCES_TOTAL, "outcome" => label).increment(1);
    let body = IssuanceResponse::new(issued, true);
    let mut headers = HeaderMap::new();
    if let Ok(location) = HeaderValue::from_str(&body.location()) {
        headers.insert(header::LOCATION, location);
    }
    if status == StatusCode::OK {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    (status, headers, axum::Json(body)).into_response()
}

/// Read an issuance and its tokens.
#[utoipa::path(
    get,
    path = "/v1/issuances/{provider}/{accountId}/{paymentIntentId}",
    tag = "issuances",
    params(PaymentPath),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The issuance and its tokens", body = IssuanceResponse),
        (status = 404, description = "No issuance for this payment (or not visible to this key)"),
        (status = 422, description = "Malformed path parameter"),
    )
)]
pub async fn get_issuance(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    PathParams(path): PathParams<PaymentPath>,
) -> Result<axum::Json<IssuanceResponse>, ApiError> {
    principal.require(Scope::Read)?;
    let key = path.visible_key(&principal, "No issuance exists for this payment.")?;
    let not_found = || ApiError::NotFound("No issuance exists for this payment.".to_owned());
    let issued = state
        .issuer
        .find_issuance(&key)
        .await?
        .ok_or_else(not_found)?;
    Ok(axum::Json(IssuanceResponse::new(issued, false)))
}
