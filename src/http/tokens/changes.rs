//! Redeem, revoke and transfer: a token's state changes, through the version gate of
//! the issuing service, with the client's `If-Match` as the gate when it sends one.
//! Under an `Idempotency-Key` the change commits with its answer (`token_answer`).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::if_match::{IfMatch, if_match};
use super::{TokenView, find_visible_token, not_found, token_answer, token_response};
use crate::domain::{Actor, FieldErrors, Owner, Scope, TokenId};
use crate::http::AppState;
use crate::http::auth::Principal;
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, OptionalJsonBody, PathParams};
use crate::http::idempotency::{IDEMPOTENT_REPLAYED, transient};
use crate::http::openapi::{IDEMPOTENCY_KEY_DOC, IF_MATCH_DOC};
use crate::issuing::{Attempt, Gate, Keyed, Transition, TransitionOutcome};
use crate::store::{TOKENS, TokenDoc};
use crate::telemetry::metric;

/// Longest accepted redemption reference or revocation reason.
const MAX_NOTE_LEN: usize = 256;

// The bodies' fields are read as any JSON value and judged by the handler: a value of
// the wrong type is then one bad field among the request's others (the path's token id
// included), where serde would refuse the body alone.

/// Optional body of a redeem.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeemRequest {
    /// The caller's reference for the redemption (order id, gate scan…), up to 256 chars.
    #[schema(value_type = Option<String>, max_length = 256)]
    pub reference: Option<Value>,
}

/// Optional body of a revoke.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// Why the token is revoked, up to 256 chars.
    #[schema(value_type = Option<String>, max_length = 256)]
    pub reason: Option<Value>,
}

/// Body of a transfer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransferRequest {
    /// The new owner: 24-hex ObjectId.
    #[schema(value_type = String, required = true, example = "65f1a0c2b3d4e5f601234568")]
    pub new_owner: Option<Value>,
}

/// A note (a reference or a reason): a string of at most [`MAX_NOTE_LEN`] characters.
fn note(text: &str) -> Result<String, String> {
    if text.chars().count() > MAX_NOTE_LEN {
        Err(format!("must be at most {MAX_NOTE_LEN} characters"))
    } else {
        Ok(text.to_owned())
    }
}

/// The scope a redeem requires, of its handler and of the layer that answers its retries
/// (`answering_retries`), which refuses a key without it first.
pub const REDEEM_SCOPE: Scope = Scope::TokensRedeem;
/// The scope a revoke requires (as [`REDEEM_SCOPE`]).
pub const REVOKE_SCOPE: Scope = Scope::TokensRevoke;
/// The scope a transfer requires (as [`REDEEM_SCOPE`]).
pub const TRANSFER_SCOPE: Scope = Scope::TokensTransfer;

/// A redeem or a revoke as its handler received it, its scope checked and its body read:
/// the two differ only in the scope, the note's field and the transition the note goes
/// into, so the rest of the request is judged here, once.
struct NotedChange<'a> {
    state: &'a AppState,
    principal: &'a Principal,
    token_id: &'a str,
    headers: &'a HeaderMap,
    attempt: Option<Arc<Attempt>>,
}

impl<'a> NotedChange<'a> {
    fn new(
        state: &'a AppState,
        principal: &'a Principal,
        token_id: &'a str,
        headers: &'a HeaderMap,
        attempt: Option<Arc<Attempt>>,
    ) -> Self {
        Self {
            state,
            principal,
            token_id,
            headers,
            attempt,
        }
    }

    /// Checks the note `value` of the body's `field` (with the body's own `errors`), then
    /// runs `transition(note)` under the `If-Match` sent, if any.
    async fn apply(
        self,
        mut errors: FieldErrors,
        field: &str,
        value: Option<Value>,
        transition: impl FnOnce(Option<String>) -> Transition,
    ) -> Result<Response, ApiError> {
        let id = errors.check("tokenId", TokenId::parse(self.token_id));
        let value = errors.optional_text(field, value.as_ref(), note);
        errors.finish().map_err(ApiError::Validation)?;
        // Unreachable: a bad id or note recorded an error above.
        let (id, value) = id.zip(value).ok_or(ApiError::Internal)?;
        let condition = if_match(self.headers)?;
        apply(
            self.state,
            self.principal,
            id,
            transition(value),
            condition,
            self.attempt,
        )
        .await
    }
}

/// Runs a transition of the token `token_id` for `principal` and maps its outcome to the
/// HTTP contract. Without `If-Match` the gate retries lost races; with a lone strong tag
/// it is the gate; otherwise (`*`, a list, weak tags) the precondition is evaluated on the
/// token as read, and the write then gates on the version just read. `attempt` holds the
/// request's `Idempotency-Key`, if it has one.
async fn apply(
    state: &AppState,
    principal: &Principal,
    id: TokenId,
    transition: Transition,
    condition: Option<IfMatch>,
    attempt: Option<Arc<Attempt>>,
) -> Result<Response, ApiError> {
    let attempt = attempt.as_deref();
    let gate = match &condition {
        None => Gate::Retry,
        Some(condition) => match condition.sole_version() {
            Some(version) => Gate::IfMatch(version),
            None => {
                let current = find_visible_token(state, principal, id).await?;
                let own_change_retried = condition.names_only_older_than(current.version)
                    && transition
                        .is_own_change_retried(&current, &Actor::api_key(&principal.key_id));
                if !condition.matches(current.version)
                    && !transition.is_replayed_by(&current)
                    && !own_change_retried
                {
                    record_version_rejection(&transition);
                    return stale(principal, condition, &current);
                }
                Gate::IfMatch(current.version)
            }
        },
    };
    let outcome = state
        .issuer
        .transition_token(
            id,
            &transition,
            gate,
            &Actor::api_key(&principal.key_id),
            |t| principal.can_see(&t.origin.provider, &t.origin.account_id),
            attempt.map(|attempt| Keyed {
                attempt,
                answer: &token_answer,
            }),
        )
        .await?;
    match outcome {
        TransitionOutcome::Applied(token) | TransitionOutcome::AlreadyDone(token) => {
            Ok(token_response(&token))
        }
        TransitionOutcome::Replayed(token) => {
            let mut response = token_response(&token);
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            Ok(response)
        }
        TransitionOutcome::NotFound => Err(not_found()),
        TransitionOutcome::VersionConflict(token) => match &condition {
            Some(condition) => stale(principal, condition, &token),
            None => Err(version_conflict(principal, &token)),
        },
        TransitionOutcome::StateConflict(token) => Err(ApiError::StateConflict {
            detail: format!(
                "Cannot {} a token that is {}.",
                transition.operation(),
                token.status.as_str()
            ),
            status: Some(token.status),
        }),
        // The same request may pass once the token stops changing: not kept.
        TransitionOutcome::Contended(token) => Ok(transient(ApiError::StateConflict {
            detail: "The token kept changing while this request ran; re-read it and retry."
                .to_owned(),
            status: Some(token.status),
        })),
        TransitionOutcome::TakenOver => Err(ApiError::RequestInProgress),
    }
}

/// The answer to `condition`, which `token` does not meet. A tag naming a version the
/// token has not reached, as read: the client saw a later one (a new primary may not show
/// it yet), so the same request may pass later: not kept. Only older ones: stale for
/// good, kept. Only for a key that may read the version anyway: whether the answer is
/// kept shows on a retry, and a key that may not would learn the version by trying tags.
fn stale(
    principal: &Principal,
    condition: &IfMatch,
    token: &TokenDoc,
) -> Result<Response, ApiError> {
    let conflict = version_conflict(principal, token);
    if condition.names_a_version_above(token.version) && principal.has(Scope::Read) {
        Ok(transient(conflict))
    } else {
        Err(conflict)
    }
}

/// A stale `If-Match`: the token's version and status only for a key that may read
/// tokens. A key that may only redeem (a ticket gate, say) would otherwise learn any
/// token's state by sending a wrong tag; it has no use for them either, since it cannot
/// read the token to decide again, and retries without `If-Match` instead.
fn version_conflict(principal: &Principal, token: &TokenDoc) -> ApiError {
    ApiError::VersionConflict {
        current: principal
            .has(Scope::Read)
            .then_some((token.version, token.status)),
    }
}

/// Counts a precondition that failed before reaching the gate, as the gate counts its own.
fn record_version_rejection(transition: &Transition) {
    metrics::counter!(
        metric::VERSION_GATE_REJECTIONS_TOTAL,
        "collection" => TOKENS,
        "operation" => transition.operation(),
    )
    .increment(1);
}

/// Redeem an active token.
///
/// With `If-Match` the given version is the gate (412 if stale). `If-Match` uses RFC 9110's
/// strong comparison: `W/"3"` never matches; `*` matches any version of an existing token
/// (the write then gates on the version just read); a list matches if any entry does.
/// Without it the server re-reads and retries a lost race with backoff, then answers 409.
/// Redeeming a redeemed or revoked token is 409 `state_conflict` — unless it was redeemed
/// with this request's non-empty `reference`: a retry, answered 200 with
/// `Idempotent-Replayed: true` and nothing written, whatever `If-Match` says.
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/redeem", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id"),
        ("If-Match" = Option<String>, Header, description = IF_MATCH_DOC, nullable = false),
        ("Idempotency-Key" = Option<String>, Header, description = IDEMPOTENCY_KEY_DOC, nullable = false),
    ),
    request_body(content = Option<RedeemRequest>, description = "Optional; an empty body is fine"),
    security(("bearer" = ["tokens:redeem"])),
    responses(
        (status = 200, description = "Redeemed, or a replay: redeemed already with this `reference`, or an Idempotency-Key's retry", body = TokenView, headers(
            ("ETag" = String, description = "The new version"),
            ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 404, description = "No such token"),
        (status = 409, description = "`state_conflict`: not active (or redeemed with another reference), or kept changing; `request_in_progress`: the first request with this Idempotency-Key is still running (`Retry-After`)",
            headers(("Retry-After" = u64, description = "With `request_in_progress`"))),
        (status = 412, description = "`version_conflict`: If-Match is stale; for a key that may read tokens, the body has currentVersion and currentStatus"),
        (status = 422, description = "`validation_failed`: bad token id, body, If-Match or Idempotency-Key; `idempotency_key_reused`: the Idempotency-Key named another request"),
    )
)]
pub async fn redeem_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    attempt: Option<Extension<Arc<Attempt>>>,
    PathParams(token_id): PathParams<String>,
    headers: HeaderMap,
    body: Result<OptionalJsonBody<RedeemRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(REDEEM_SCOPE)?;
    let attempt = attempt.map(|Extension(attempt)| attempt);
    let OptionalJsonBody(body, errors) = body?;
    let change = NotedChange::new(&state, &principal, &token_id, &headers, attempt);
    change
        .apply(errors, "reference", body.reference, |reference| {
            Transition::Redeem { reference }
        })
        .await
}

/// Revoke a token.
///
/// Revoking a revoked token is 200 with the version unchanged; revoking a redeemed token
/// is 409 `state_conflict`. `If-Match` works as for redeem.
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/revoke", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id"),
        ("If-Match" = Option<String>, Header, description = IF_MATCH_DOC, nullable = false),
        ("Idempotency-Key" = Option<String>, Header, description = IDEMPOTENCY_KEY_DOC, nullable = false),
    ),
    request_body(content = Option<RevokeRequest>, description = "Optional; an empty body is fine"),
    security(("bearer" = ["tokens:revoke"])),
    responses(
        (status = 200, description = "Revoked (or already revoked)", body = TokenView, headers(
            ("ETag" = String, description = "The version"),
            ("Idempotent-Replayed" = String, description = "`true` on an Idempotency-Key's retry"))),
        (status = 404, description = "No such token"),
        (status = 409, description = "`state_conflict`: redeemed, or kept changing; `request_in_progress`: the first request with this Idempotency-Key is still running (`Retry-After`)",
            headers(("Retry-After" = u64, description = "With `request_in_progress`"))),
        (status = 412, description = "`version_conflict`"),
        (status = 422, description = "`validation_failed`: bad token id, body, If-Match or Idempotency-Key; `idempotency_key_reused`: the Idempotency-Key named another request"),
    )
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    attempt: Option<Extension<Arc<Attempt>>>,
    PathParams(token_id): PathParams<String>,
    headers: HeaderMap,
    body: Result<OptionalJsonBody<RevokeRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(REVOKE_SCOPE)?;
    let attempt = attempt.map(|Extension(attempt)| attempt);
    let OptionalJsonBody(body, errors) = body?;
    let change = NotedChange::new(&state, &principal, &token_id, &headers, attempt);
    change
        .apply(errors, "reason", body.reason, |reason| Transition::Revoke {
            reason,
        })
        .await
}

/// Transfer an active token to a new owner. `If-Match` is required (428 without).
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/transfer", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id"),
        ("If-Match" = String, Header, description = "The version the transfer is based on, e.g. \"3\"; or `*`, or a list, as for redeem. Compared strongly: a weak tag (`W/\"3\"`) never matches (412)"),
        ("Idempotency-Key" = Option<String>, Header, description = IDEMPOTENCY_KEY_DOC, nullable = false),
    ),
    request_body = TransferRequest,
    security(("bearer" = ["tokens:transfer"])),
    responses(
        (status = 200, description = "Transferred", body = TokenView, headers(
            ("ETag" = String, description = "The new version"),
            ("Idempotent-Replayed" = String, description = "`true` on an Idempotency-Key's retry"))),
        (status = 404, description = "No such token"),
        (status = 409, description = "`state_conflict`: not active, or kept changing; `request_in_progress`: the first request with this Idempotency-Key is still running (`Retry-After`)",
            headers(("Retry-After" = u64, description = "With `request_in_progress`"))),
        (status = 412, description = "`version_conflict`"),
        (status = 422, description = "`validation_failed`: bad token id, newOwner, If-Match or Idempotency-Key; `idempotency_key_reused`: the Idempotency-Key named another request"),
        (status = 428, description = "`precondition_required`: If-Match missing"),
    )
)]
pub async fn transfer_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    attempt: Option<Extension<Arc<Attempt>>>,
    PathParams(token_id): PathParams<String>,
    headers: HeaderMap,
    body: Result<JsonBody<TransferRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(TRANSFER_SCOPE)?;
    let attempt = attempt.map(|Extension(attempt)| attempt);
    let JsonBody(body, mut errors) = body?;
    let id = errors.check("tokenId", TokenId::parse(&token_id));
    let new_owner = errors.required_text("newOwner", body.new_owner.as_ref(), Owner::parse);
    errors.finish().map_err(ApiError::Validation)?;
    // Unreachable: a bad id, or a missing or bad owner, recorded an error above.
    let (id, new_owner) = id.zip(new_owner).ok_or(ApiError::Internal)?;
    let condition = if_match(&headers)?.ok_or(ApiError::PreconditionRequired(
        "A transfer needs If-Match with the token's current ETag.",
    ))?;
    let transition = Transition::Transfer { new_owner };
    apply(&state, &principal, id, transition, Some(condition), attempt).await
}
