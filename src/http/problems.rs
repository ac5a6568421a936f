//! The catalogue of problem codes: every problem document's `type` resolves, through
//! `GET /problems/{code}` (`http::problem_types`), to a description of its code from the
//! one table below.

use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

/// Defines [`ProblemCode`] from one table, so the codes problem documents carry, the
/// descriptions `GET /problems/{code}` serves and the OpenAPI enum cannot drift apart.
/// (`$code:tt`, not `:literal`: utoipa's derive reads `serde(rename)` only from a plain
/// string token, not from the invisible group a `literal` fragment arrives in.)
macro_rules! problem_codes {
    ($($variant:ident = $code:tt, $status:ident, $title:literal, $description:literal;)+) => {
        /// Every problem `code` tokenmint answers with. Each names a problem type that
        /// resolves: `GET /problems/{code}` describes it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
        pub enum ProblemCode {
            $(#[serde(rename = $code)] $variant,)+
        }

        impl ProblemCode {
            /// Every code, in table order.
            pub const ALL: &[ProblemCode] = &[$(Self::$variant,)+];

            /// The stable, machine-readable code.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $code,)+ }
            }

            /// The status every problem of this type answers with.
            pub fn status(self) -> StatusCode {
                match self { $(Self::$variant => StatusCode::$status,)+ }
            }

            /// The human title problem documents of this type carry.
            pub fn title(self) -> &'static str {
                match self { $(Self::$variant => $title,)+ }
            }

            /// What the problem means and what a client should do about it.
            pub fn description(self) -> &'static str {
                match self { $(Self::$variant => $description,)+ }
            }
        }
    };
}

problem_codes! {
    MalformedJson = "malformed_json", BAD_REQUEST, "Malformed JSON",
        "The request body is not valid JSON, or could not be read. Fix the body: sent again unchanged it fails the same way.";
    Unauthorized = "unauthorized", UNAUTHORIZED, "Unauthorized",
        "The request has no API key, a malformed Authorization header, or a key that is not configured. Send `Authorization: Bearer <key>`. The answer carries `WWW-Authenticate: Bearer realm=\"tokenmint\"`, with `error=\"invalid_token\"` when a key was presented but is unknown.";
    SignatureMissing = "signature_missing", UNAUTHORIZED, "Webhook signature rejected",
        "A webhook delivery lacks the signature header(s) of the provider's configured scheme (`Stripe-Signature`, or `webhook-id`, `webhook-timestamp` and `webhook-signature` for Standard Webhooks). The answer carries `WWW-Authenticate: Signature realm=\"webhooks\"`.";
    SignatureInvalid = "signature_invalid", UNAUTHORIZED, "Webhook signature rejected",
        "A webhook delivery's signature does not match its raw body with any configured secret of the provider. Nothing was processed. The answer carries `WWW-Authenticate: Signature realm=\"webhooks\"`.";
    SignatureTimestampOutOfTolerance = "signature_timestamp_out_of_tolerance", UNAUTHORIZED, "Webhook signature rejected",
        "A webhook delivery's signed timestamp is outside the accepted tolerance (a replay, or a clock far off). Nothing was processed. The answer carries `WWW-Authenticate: Signature realm=\"webhooks\"`.";
    BasicAuthInvalid = "basic_auth_invalid", UNAUTHORIZED, "Webhook credentials rejected",
        "The webhook provider is configured with HTTP Basic credentials (`basic_auth_username`, `basic_auth_password`; scheme `adyen`) and the delivery's `Authorization: Basic` header is missing or does not match them. Checked before the signature; nothing was read or processed. The answer carries `WWW-Authenticate: Basic realm=\"webhooks\"`.";
    Forbidden = "forbidden", FORBIDDEN, "Forbidden",
        "The API key is valid but lacks the scope this operation needs, or may not act on the account the request names. Another key is needed; retrying does not help.";
    NotFound = "not_found", NOT_FOUND, "Not found",
        "No such resource, or one the API key may not see (another account's data answers as absent). Also the answer to an unknown path or an unconfigured webhook provider.";
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED, "Method not allowed",
        "The path exists but does not support the request's method. The `Allow` header lists the methods it supports.";
    IdempotencyConflict = "idempotency_conflict", CONFLICT, "Idempotency conflict",
        "The payment was already issued with other parameters, or the owner's redemption `reference` was used with other parameters; `mismatches` lists the fields that differ. A payment's tokens are issued exactly once and a reference names one redemption, so this request is never applied.";
    InsufficientBalance = "insufficient_balance", CONFLICT, "Insufficient balance",
        "The owner has fewer active tokens of the type (within the account, and the key's accounts) than the redemption asks for; `available` says how many. Nothing was redeemed.";
    IdempotencyKeyReused = "idempotency_key_reused", UNPROCESSABLE_ENTITY, "Idempotency key reused",
        "The `Idempotency-Key` was used before, by this API key, for another request (another method, path or body). A key names one request: send a new request with a new key, or this one again unchanged.";
    RequestInProgress = "request_in_progress", CONFLICT, "Request in progress",
        "The first request with this `Idempotency-Key` is still running. Retry after `Retry-After` seconds: once it is answered, a retry gets its answer.";
    StateConflict = "state_conflict", CONFLICT, "State conflict",
        "The resource's state forbids the change (e.g. redeeming a redeemed or revoked token), or the token kept changing while the request ran. `currentStatus`, when present, says where it is; re-read before deciding again.";
    PaymentNotSucceeded = "payment_not_succeeded", CONFLICT, "Payment not succeeded",
        "The provider reports the payment in a state other than succeeded, so no tokens are issued for it.";
    VersionConflict = "version_conflict", PRECONDITION_FAILED, "Version conflict",
        "`If-Match` does not match the token's current version. Comparison is strong (RFC 9110 §8.8.3.2): a weak tag such as `W/\"3\"` never matches. For a key that may read tokens, `currentVersion` and `currentStatus` say where the token is; re-read it, decide again, and retry with its new ETag. A key that may only change tokens is told neither (it would learn any token's state by sending a wrong tag); it retries without `If-Match`. A revoke or transfer retried by the key whose first attempt made that very change, under that attempt's (older) tag, is not refused but answered 200.";
    PayloadTooLarge = "payload_too_large", PAYLOAD_TOO_LARGE, "Payload too large",
        "The request body exceeds the configured limit (`server.body_limit_bytes`; for a provider's event, `webhooks.body_limit_bytes`).";
    UnsupportedMediaType = "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE, "Unsupported media type",
        "The request has a body that is not `Content-Type: application/json` (or another `application/*+json`).";
    ValidationFailed = "validation_failed", UNPROCESSABLE_ENTITY, "Validation failed",
        "One or more fields, path segments, query parameters or headers are invalid; `errors` names each (`field`) with a message.";
    PreconditionRequired = "precondition_required", PRECONDITION_REQUIRED, "Precondition required",
        "The change needs `If-Match` with the token's ETag (a transfer always does): read the token first.";
    RateLimited = "rate_limited", TOO_MANY_REQUESTS, "Too many requests",
        "The API key, or the webhook provider, exceeded its rate limit. Wait the number of seconds in `Retry-After` (a whole number, rounded up) before retrying.";
    DatabaseUnavailable = "database_unavailable", SERVICE_UNAVAILABLE, "Database unavailable",
        "MongoDB did not answer, or did not confirm a write durable in time. Nothing is left half-done: retry the same request after `Retry-After` seconds. A request that is safe to retry (an issuance, a redemption, a redeem with its `reference`, a token action with an `Idempotency-Key`) is then answered as if it had been sent once; a token action without either may find its own change done (409 or 412).";
    TransactionsUnavailable = "transactions_unavailable", SERVICE_UNAVAILABLE, "Transactions unavailable",
        "Atomic issuance and redemptions by amount need MongoDB transactions (a replica set) and this deployment has none; issue in mode `upsert` instead.";
    RequestTimeout = "request_timeout", SERVICE_UNAVAILABLE, "Request timed out",
        "The request did not complete within `server.request_timeout_ms`. Retry the same request after `Retry-After` seconds: issuance is idempotent.";
    InternalError = "internal_error", INTERNAL_SERVER_ERROR, "Internal error",
        "An unexpected error occurred; it is logged with the request id (`x-request-id`). Report it with that id.";
}

impl ProblemCode {
    /// The code named `code`, if there is one.
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == code)
    }

    /// The URI reference of this problem type, as problem documents carry it in `type`.
    pub fn type_uri(self) -> String {
        format!("/problems/{}", self.as_str())
    }

    /// What `GET /problems/{code}` answers.
    pub fn describe(self) -> ProblemType {
        ProblemType {
            code: self,
            title: self.title(),
            status: self.status().as_u16(),
            description: self.description(),
        }
    }
}

/// A problem type: what the `type` `/problems/{code}` of a problem document means.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProblemType {
    pub code: ProblemCode,
    pub title: &'static str,
    /// The HTTP status problems of this type answer with.
    pub status: u16,
    pub description: &'static str,
}
