//! The one error envelope: every failure is `application/problem+json` (RFC 9457) with a
//! stable `code` clients can branch on. Internal causes are logged here, once, and never
//! put in the body. The failures many operations share are documented here too, once
//! (`KeyedErrors`, `BodyErrors`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

mod documented;

use super::problems::ProblemCode;
use super::rate_limit::{LimitHeaders, Refused};
use crate::domain::{FieldError, Mismatch, PaymentStatus, TokenStatus};
use crate::issuing::{IssueError, RedemptionError};
use crate::store::StoreError;
use crate::webhooks::SignatureError;

pub use documented::{BodyErrors, KeyedErrors};

/// Seconds a client should wait before retrying a 503 or a request still in progress.
const RETRY_AFTER_UNAVAILABLE: &str = "1";

/// The realm of the API-key challenge (`WWW-Authenticate: Bearer realm="tokenmint"`).
pub const API_KEY_REALM: &str = "tokenmint";

/// The detail of the 401 for a well-formed bearer key that is not configured: the one
/// case whose challenge says `error="invalid_token"` (RFC 6750 §3.1).
pub const UNKNOWN_API_KEY: &str = "Unknown API key.";

/// The field error of a provider a checkout key may not name (not configured here).
pub const UNKNOWN_PROVIDER: &str = "is not a configured payment provider";

/// The challenge of a webhook signature failure: deliveries are authenticated by the
/// provider's signature over the raw body (Stripe-Signature or Standard Webhooks), not by
/// an API key.
pub const WEBHOOK_SIGNATURE_CHALLENGE: &str = "Signature realm=\"webhooks\"";

/// The challenge of a webhook delivery without the provider's configured HTTP Basic
/// credentials (`providers.<name>.basic_auth_username`).
pub const WEBHOOK_BASIC_CHALLENGE: &str = "Basic realm=\"webhooks\", charset=\"UTF-8\"";

/// Every way a request can fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    #[error("webhook signature rejected: {0}")]
    WebhookSignature(SignatureError),
    #[error("webhook credentials rejected")]
    WebhookCredentials,
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("idempotency conflict")]
    IdempotencyConflict(Vec<Mismatch>),
    #[error("redemption conflict")]
    RedemptionConflict(Vec<Mismatch>),
    #[error("insufficient balance")]
    InsufficientBalance { available: u64 },
    #[error("idempotency key reused")]
    IdempotencyKeyReused,
    #[error("request in progress")]
    RequestInProgress,
    #[error("state conflict: {detail}")]
    StateConflict {
        detail: String,
        status: Option<TokenStatus>,
    },
    #[error("payment not succeeded")]
    /// The payment's status forbids issuing (the detail names it).
    PaymentNotSucceeded(PaymentStatus),
    #[error("version conflict")]
    /// `current`: where the token is, for a key that may read it; `None` tells a key
    /// that may only change tokens nothing it could not have learnt otherwise.
    VersionConflict { current: Option<(i64, TokenStatus)> },
    #[error("payload too large")]
    PayloadTooLarge,
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    #[error("precondition required: {0}")]
    PreconditionRequired(&'static str),
    #[error("rate limited")]
    RateLimited {
        retry_after_secs: u64,
        /// The limit that refused, told as `RateLimit-Policy` and `RateLimit`.
        limit: LimitHeaders,
    },
    #[error("database unavailable")]
    DatabaseUnavailable,
    #[error("transactions unavailable")]
    TransactionsUnavailable,
    #[error("request timed out")]
    Timeout,
    #[error("internal error")]
    Internal,
}

/// The most bad fields a `validation_failed` answer lists. A query of repeated parameters
/// names one bad field per parameter: listed in full, an 8 KB query answered 100 KB.
pub const MAX_LISTED_ERRORS: usize = 20;

/// The problem document. Optional members appear only where they apply.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// A URI reference naming the problem type, `/problems/<code>`: it resolves, and a GET
    /// of it describes the code.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable, machine-readable: branch on this, not on `title` or `detail`.
    pub code: String,
    /// `validation_failed`: the bad fields, the first 20 (`MAX_LISTED_ERRORS`) when there
    /// are more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
    /// `validation_failed`: how many more bad fields there were than `errors` lists;
    /// present only when some were left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub errors_omitted: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mismatches: Option<Vec<Mismatch>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_status: Option<TokenStatus>,
    /// `insufficient_balance`: how many active tokens there are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available: Option<u64>,
}

impl ApiError {
    pub fn validation(field: &str, message: impl Into<String>) -> Self {
        Self::Validation(vec![FieldError::new(field, message)])
    }

    fn status(&self) -> StatusCode {
        self.code().status()
    }

    /// The stable code: its row of the [`ProblemCode`] table gives the status and title.
    pub fn code(&self) -> ProblemCode {
        match self {
            Self::MalformedJson(_) => ProblemCode::MalformedJson,
            Self::Unauthorized(_) => ProblemCode::Unauthorized,
            Self::WebhookSignature(refused) => match refused {
                SignatureError::Missing => ProblemCode::SignatureMissing,
                SignatureError::Invalid => ProblemCode::SignatureInvalid,
                SignatureError::OutOfTolerance => ProblemCode::SignatureTimestampOutOfTolerance,
            },
            Self::WebhookCredentials => ProblemCode::BasicAuthInvalid,
            Self::Forbidden(_) => ProblemCode::Forbidden,
            Self::NotFound(_) => ProblemCode::NotFound,
            Self::MethodNotAllowed => ProblemCode::MethodNotAllowed,
            Self::IdempotencyConflict(_) => ProblemCode::IdempotencyConflict,
            Self::RedemptionConflict(_) => ProblemCode::IdempotencyConflict,
            Self::InsufficientBalance { .. } => ProblemCode::InsufficientBalance,
            Self::IdempotencyKeyReused => ProblemCode::IdempotencyKeyReused,
            Self::RequestInProgress => ProblemCode::RequestInProgress,
            Self::StateConflict { .. } => ProblemCode::StateConflict,
            Self::PaymentNotSucceeded(_) => ProblemCode::PaymentNotSucceeded,
            Self::VersionConflict { .. } => ProblemCode::VersionConflict,
            Self::PayloadTooLarge => ProblemCode::PayloadTooLarge,
            Self::UnsupportedMediaType => ProblemCode::UnsupportedMediaType,
            Self::Validation(_) => ProblemCode::ValidationFailed,
            Self::PreconditionRequired(_) => ProblemCode::PreconditionRequired,
            Self::RateLimited { .. } => ProblemCode::RateLimited,
            Self::DatabaseUnavailable => ProblemCode::DatabaseUnavailable,
            Self::TransactionsUnavailable => ProblemCode::TransactionsUnavailable,
            Self::Timeout => ProblemCode::RequestTimeout,
            Self::Internal => ProblemCode::InternalError,
        }
    }

    /// The `WWW-Authenticate` challenge a 401 carries (RFC 9110 §11.6.1): the bearer scheme
    /// for API keys (RFC 6750 §3), the signature scheme for webhook deliveries.
    fn challenge(&self) -> Option<String> {
        match self {
            Self::Unauthorized(UNKNOWN_API_KEY) => Some(format!(
                "Bearer realm=\"{API_KEY_REALM}\", error=\"invalid_token\""
            )),
            Self::Unauthorized(_) => Some(format!("Bearer realm=\"{API_KEY_REALM}\"")),
            Self::WebhookSignature(_) => Some(format!(
                "{WEBHOOK_SIGNATURE_CHALLENGE}, error=\"{}\"",
                self.code().as_str()
            )),
            Self::WebhookCredentials => Some(WEBHOOK_BASIC_CHALLENGE.to_owned()),
            _ => None,
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::MalformedJson(detail) => format!("The body is not valid JSON: {detail}"),
            Self::Unauthorized(detail) => (*detail).to_owned(),
            Self::WebhookSignature(refused) => match refused {
                SignatureError::Missing => "The provider's signature header is missing.",
                SignatureError::OutOfTolerance => {
                    "The signature's timestamp is outside the accepted tolerance."
                }
                SignatureError::Invalid => {
                    "The signature does not match the body with any configured secret."
                }
            }
            .to_owned(),
            Self::WebhookCredentials => {
                "The delivery lacks the provider's HTTP Basic credentials, or they do not match.".to_owned()
            }
            Self::Forbidden(detail) | Self::NotFound(detail) => detail.clone(),
            Self::PaymentNotSucceeded(status) => {
                format!("The payment is {}; no tokens will be issued.", status.as_str())
            }
            Self::MethodNotAllowed => {
                "This path does not support the request's method; see the Allow header.".to_owned()
            }
            Self::StateConflict { detail, .. } => detail.clone(),
            Self::RedemptionConflict(_) => {
                "This reference names a redemption with other parameters; see mismatches.".to_owned()
            }
            Self::InsufficientBalance { available } => {
                format!("Only {available} active tokens are available; nothing was redeemed.")
            }
            Self::IdempotencyKeyReused => {
                "This Idempotency-Key was used for another request; use a new key for a new request.".to_owned()
            }
            Self::RequestInProgress => {
                "The first request with this Idempotency-Key is still running; retry shortly.".to_owned()
            }
            Self::IdempotencyConflict(mismatches) if mismatches.is_empty() => {
                "This payment was already issued or requested with other parameters.".to_owned()
            }
            Self::IdempotencyConflict(_) => {
                "This payment was already issued with other parameters; see mismatches.".to_owned()
            }
            Self::VersionConflict {
                current: Some((version, _)),
            } => {
                format!("The token is at version {version}; re-read it and retry with If-Match: \"{version}\".")
            }
            Self::VersionConflict { current: None } => {
                "If-Match does not match the token's current version; re-read it with a key that may read tokens, or retry without If-Match.".to_owned()
            }
            Self::PayloadTooLarge => "The request body exceeds the configured limit.".to_owned(),
            Self::UnsupportedMediaType => "Send the body as Content-Type: application/json.".to_owned(),
            Self::Validation(errors) if errors.len() > MAX_LISTED_ERRORS => format!(
                "{} fields are invalid; errors lists the first {MAX_LISTED_ERRORS}.",
                errors.len()
            ),
            Self::Validation(_) => "One or more fields are invalid; see errors.".to_owned(),
            Self::PreconditionRequired(detail) => (*detail).to_owned(),
            Self::RateLimited {
                retry_after_secs, ..
            } => {
                format!("Rate limit exceeded; retry after {retry_after_secs} s.")
            }
            Self::DatabaseUnavailable => "The database is unavailable; retry later.".to_owned(),
            Self::TransactionsUnavailable => {
                "Atomic issuance and redemptions need MongoDB transactions (a replica set); this deployment has none. Issue in mode \"upsert\".".to_owned()
            }
            Self::Timeout => "The request did not complete in time; retry later.".to_owned(),
            Self::Internal => "An internal error occurred.".to_owned(),
        }
    }

    /// The problem document this error answers with.
    pub fn problem(&self) -> Problem {
        let code = self.code();
        let mut problem = Problem {
            problem_type: code.type_uri(),
            title: code.title().to_owned(),
            status: code.status().as_u16(),
            detail: self.detail(),
            code: code.as_str().to_owned(),
            errors: None,
            errors_omitted: None,
            mismatches: None,
            current_version: None,
            current_status: None,
            available: None,
        };
        match self {
            Self::Validation(errors) => {
                let listed = errors.len().min(MAX_LISTED_ERRORS);
                problem.errors = Some(errors[..listed].to_vec());
                problem.errors_omitted = Some((errors.len() - listed) as u64).filter(|&n| n > 0);
            }
            Self::IdempotencyConflict(mismatches) | Self::RedemptionConflict(mismatches) => {
                problem.mismatches = Some(mismatches.clone()).filter(|m| !m.is_empty())
            }
            Self::InsufficientBalance { available } => problem.available = Some(*available),
            Self::VersionConflict { current } => {
                problem.current_version = current.map(|(version, _)| version);
                problem.current_status = current.map(|(_, status)| status);
            }
            Self::StateConflict { status, .. } => problem.current_status = *status,
            _ => {}
        }
        problem
    }
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        Self::RateLimited {
            retry_after_secs: refused.retry_after_secs,
            limit: refused.limit,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(source) => {
                tracing::warn!(error = %source, "database unavailable");
                Self::DatabaseUnavailable
            }
            // The payment's keys are held by another transaction (one a crashed instance
            // left open, most likely): the same answer as an outage, retry later.
            StoreError::Contended(source) => {
                tracing::warn!(error = %source, "transaction kept conflicting");
                Self::DatabaseUnavailable
            }
            StoreError::TransactionsUnavailable => Self::TransactionsUnavailable,
            StoreError::Internal(message) => {
                tracing::error!(error = %message, "store error");
                Self::Internal
            }
        }
    }
}

impl From<IssueError> for ApiError {
    fn from(err: IssueError) -> Self {
        match err {
            IssueError::Conflict(mismatches) => Self::IdempotencyConflict(mismatches),
            IssueError::PaymentNotSucceeded(status) => Self::PaymentNotSucceeded(status),
            IssueError::NeedsTrustedIssuer(detail) => Self::StateConflict {
                detail: detail.to_owned(),
                status: None,
            },
            IssueError::UnknownProvider => Self::validation("provider", UNKNOWN_PROVIDER),
            IssueError::Store(err) => err.into(),
        }
    }
}

impl From<RedemptionError> for ApiError {
    fn from(err: RedemptionError) -> Self {
        match err {
            RedemptionError::Conflict(mismatches) => Self::RedemptionConflict(mismatches),
            RedemptionError::Insufficient { available } => Self::InsufficientBalance { available },
            // Lost races for the tokens all along: retry later, as for an outage.
            RedemptionError::Contended => {
                tracing::warn!("a redemption kept losing races for its tokens");
                Self::DatabaseUnavailable
            }
            // Neither answered nor refused until the majority has the first attempt.
            RedemptionError::AwaitingMajority => {
                tracing::warn!(
                    "a redemption's reference is committed on the primary but not on the majority: replication lags"
                );
                Self::DatabaseUnavailable
            }
            // Another attempt holds the key now and answers the request.
            RedemptionError::TakenOver => Self::RequestInProgress,
            RedemptionError::Store(err) => err.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match &self {
            Self::RateLimited {
                retry_after_secs,
                limit,
            } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
                limit.insert_into(headers);
            }
            Self::DatabaseUnavailable | Self::Timeout | Self::RequestInProgress => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(RETRY_AFTER_UNAVAILABLE),
                );
            }
            _ => {}
        }
        if let Some(challenge) = self.challenge()
            && let Ok(value) = HeaderValue::from_str(&challenge)
        {
            headers.insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

#[cfg(test)]
mod tests;
