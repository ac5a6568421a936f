//! `/v1/tokens`: read, list, and change a token's state through the version gate.
//! `ETag` and `If-Match` carry the token's `_version`, quoted (`"3"`).

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, Problem};
use super::extract::{JsonBody, OptionalJsonBody};
use crate::domain::Scope;
use crate::domain::{FieldErrors, Owner, TokenId, TokenStatus, TokenType};
use crate::issuing::{Gate, Transition, TransitionOutcome};
use crate::store::{TOKENS, TokenDoc, TokenQuery, chrono_time};

/// Listing page size: default and maximum.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;
/// Longest accepted redemption reference or revocation reason.
const MAX_NOTE_LEN: usize = 256;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/tokens", get(list_tokens))
        .route("/v1/tokens/{tokenId}", get(get_token))
        .route("/v1/tokens/{tokenId}/redeem", post(redeem_token))
        .route("/v1/tokens/{tokenId}/revoke", post(revoke_token))
        .route("/v1/tokens/{tokenId}/transfer", post(transfer_token))
}

/// The payment a token was issued for.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OriginView {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub date: DateTime<Utc>,
}

/// A token as clients see it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub id: String,
    pub owner: String,
    pub token_type: String,
    pub token_index: i64,
    pub status: TokenStatus,
    /// The `_version`; also the `ETag`.
    pub version: i64,
    pub origin: OriginView,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redeemed_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redemption_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation_reason: Option<String>,
}

impl From<TokenDoc> for TokenView {
    fn from(t: TokenDoc) -> Self {
        Self {
            id: t.id.to_hex(),
            owner: t.owner.to_hex(),
            token_type: t.token_type,
            token_index: t.token_index,
            status: t.status,
            version: t.version,
            origin: OriginView {
                provider: t.origin.provider,
                account_id: t.origin.account_id,
                payment_intent_id: t.origin.payment_intent_id,
                date: chrono_time(t.origin.date),
            },
            created_at: chrono_time(t.created_at),
            updated_at: chrono_time(t.updated_at),
            redeemed_at: t.redeemed_at.map(chrono_time),
            redemption_ref: t.redemption_ref,
            revoked_at: t.revoked_at.map(chrono_time),
            revocation_reason: t.revocation_reason,
        }
    }
}

/// A page of tokens.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenPage {
    pub items: Vec<TokenView>,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next_after: Option<String>,
}

/// Optional body of a redeem.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeemRequest {
    /// The caller's reference for the redemption (order id, gate scan…), up to 256 chars.
    #[schema(max_length = 256)]
    pub reference: Option<String>,
}

/// Optional body of a revoke.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// Why the token is revoked, up to 256 chars.
    #[schema(max_length = 256)]
    pub reason: Option<String>,
}

/// Body of a transfer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransferRequest {
    /// The new owner: 24-hex ObjectId.
    #[schema(value_type = String, required = true, pattern = r"^[0-9a-fA-F]{24}$", example = "65f1a0c2b3d4e5f601234568")]
    pub new_owner: Option<String>,
}

/// The token with its `ETag`.
fn token_response(token: TokenDoc) -> Response {
    let etag = format!("\"{}\"", token.version);
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    (headers, axum::Json(TokenView::from(token))).into_response()
}

fn parse_token_id(raw: &str) -> Result<TokenId, ApiError> {
    TokenId::parse(raw).map_err(|message| ApiError::validation("tokenId", message))
}

fn not_found() -> ApiError {
    ApiError::NotFound("No such token.".to_owned())
}

/// What openapi.yaml documents for `If-Match`, and exactly what [`if_match`] accepts: `*`,
/// or a comma-separated list of token versions, each quoted (`"3"`), weak (`W/"3"`) or
/// bare (`3`), 1–18 digits (which always fit an i64). The utoipa annotations repeat it
/// as a literal (utoipa takes no constant there); unit tests check all three agree.
#[cfg(test)]
const IF_MATCH_PATTERN: &str = r#"^[ \t]*(\*|(W/)?("[0-9]{1,18}"|[0-9]{1,18})([ \t]*,[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18}))*)[ \t]*$"#;

/// An `If-Match` precondition (RFC 9110 §13.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
enum IfMatch {
    /// `*`: any current version of an existing token.
    Any,
    /// One or more entity tags; the condition holds if any of them matches.
    Tags(Vec<EntityTag>),
}

/// One entity tag naming a token version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EntityTag {
    weak: bool,
    version: i64,
}

impl IfMatch {
    /// RFC 9110's strong comparison (§8.8.3.2), which `If-Match` requires: a weak tag
    /// never matches, a strong one matches only its own version.
    fn matches(&self, version: i64) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => tags.iter().any(|t| !t.weak && t.version == version),
        }
    }

    /// The version a write can gate on without reading the token first: that of a lone
    /// strong tag. `*`, lists and weak tags are evaluated against the token as read.
    fn sole_version(&self) -> Option<i64> {
        match self.tags() {
            [tag] if !tag.weak => Some(tag.version),
            _ => None,
        }
    }

    fn tags(&self) -> &[EntityTag] {
        match self {
            Self::Any => &[],
            Self::Tags(tags) => tags,
        }
    }
}

/// The `If-Match` precondition, from every `If-Match` field line (a recipient combines
/// them as one list, RFC 9110 §5.3). Absent → `None`; anything `IF_MATCH_PATTERN`
/// refuses → 422.
fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let mut lines = headers.get_all(header::IF_MATCH).iter().peekable();
    if lines.peek().is_none() {
        return Ok(None);
    }
    let invalid = || {
        ApiError::validation(
            "If-Match",
            "must be `*` or token versions as given in their ETag, e.g. \"3\"",
        )
    };
    let mut text = String::new();
    for line in lines {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(line.to_str().map_err(|_| invalid())?);
    }
    let text = text.trim_matches([' ', '\t']);
    if text == "*" {
        return Ok(Some(IfMatch::Any));
    }
    text.split(',')
        .map(|element| entity_tag(element.trim_matches([' ', '\t'])))
        .collect::<Option<Vec<_>>>()
        .map(|tags| Some(IfMatch::Tags(tags)))
        .ok_or_else(invalid)
}

/// `"3"`, `W/"3"` or `3`: no sign, space or stray quote slips through.
fn entity_tag(element: &str) -> Option<EntityTag> {
    let (weak, tag) = match element.strip_prefix("W/") {
        Some(tag) => (true, tag),
        None => (false, element),
    };
    let digits = tag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(tag);
    Some(digits)
        .filter(|d| (1..=18).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<i64>().ok())
        .map(|version| EntityTag { weak, version })
}

fn note(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(text) if text.chars().count() > MAX_NOTE_LEN => Err(ApiError::validation(
            field,
            format!("must be at most {MAX_NOTE_LEN} characters"),
        )),
        other => Ok(other),
    }
}

/// Runs a transition of the token `token_id` for `principal` and maps its outcome to the
/// HTTP contract. Without `If-Match` the gate retries lost races; with a lone strong tag
/// it is the gate; otherwise (`*`, a list, weak tags) the precondition is evaluated on the
/// token as read, and the write then gates on the version just read.
async fn apply(
    state: &AppState,
    principal: &Principal,
    token_id: &str,
    transition: Transition,
    condition: Option<IfMatch>,
) -> Result<Response, ApiError> {
    let id = parse_token_id(token_id)?;
    let gate = match condition {
        None => Gate::Retry,
        Some(condition) => match condition.sole_version() {
            Some(version) => Gate::IfMatch(version),
            None => {
                let current = state
                    .issuer
                    .store()
                    .find_token(id)
                    .await?
                    .filter(|t| principal.can_see(&t.origin.account_id))
                    .ok_or_else(not_found)?;
                if !condition.matches(current.version) {
                    record_version_rejection(&transition);
                    return Err(version_conflict(&current));
                }
                Gate::IfMatch(current.version)
            }
        },
    };
    let outcome = state
        .issuer
        .transition_token(id, &transition, gate, |t| {
            principal.can_see(&t.origin.account_id)
        })
        .await?;
    match outcome {
        TransitionOutcome::Applied(token) | TransitionOutcome::AlreadyDone(token) => {
            Ok(token_response(token))
        }
        TransitionOutcome::NotFound => Err(not_found()),
        TransitionOutcome::VersionConflict(token) => Err(version_conflict(&token)),
        TransitionOutcome::StateConflict(token) => Err(ApiError::StateConflict {
            detail: format!(
                "Cannot {} a token that is {}.",
                transition.operation(),
                token.status.as_str()
            ),
            status: Some(token.status),
        }),
        TransitionOutcome::Contended(token) => Err(ApiError::StateConflict {
            detail: "The token kept changing while this request ran; re-read it and retry."
                .to_owned(),
            status: Some(token.status),
        }),
    }
}

fn version_conflict(token: &TokenDoc) -> ApiError {
    ApiError::VersionConflict {
        current_version: token.version,
        status: token.status,
    }
}

/// Counts a precondition that failed before reaching the gate, as the gate counts its own.
fn record_version_rejection(transition: &Transition) {
    metrics::counter!(
        "tokenmint_version_gate_rejections_total",
        "collection" => TOKENS,
        "operation" => transition.operation(),
    )
    .increment(1);
}

/// Read a token.
#[utoipa::path(
    get, path = "/v1/tokens/{tokenId}", tag = "tokens",
    params(("tokenId" = String, Path, description = "24-hex token id", pattern = r"^[0-9a-fA-F]{24}$")),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The token", body = TokenView,
            headers(("ETag" = String, description = "The quoted version, e.g. \"3\""))),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Scope not allowed", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token (or not visible to this key)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Malformed token id", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    Path(token_id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require(Scope::Read)?;
    let id = parse_token_id(&token_id)?;
    let token = state
        .issuer
        .store()
        .find_token(id)
        .await?
        .filter(|t| principal.can_see(&t.origin.account_id))
        .ok_or_else(not_found)?;
    Ok(token_response(token))
}

/// List tokens, oldest first, with a cursor.
///
/// Paging follows `_id`: a walk with `after = nextAfter` visits every token that existed
/// when it began exactly once, even while new tokens are being issued.
#[utoipa::path(
    get, path = "/v1/tokens", tag = "tokens",
    params(
        ("owner" = Option<String>, Query, description = "Only this owner's tokens (24-hex)", pattern = r"^[0-9a-fA-F]{24}$"),
        ("tokenType" = Option<String>, Query, description = "Only this token type", pattern = r"^[a-z0-9][a-z0-9_.-]{0,63}$"),
        ("status" = Option<TokenStatus>, Query, description = "Only tokens in this state"),
        ("limit" = Option<u32>, Query, description = "Page size, 1–500, default 50", minimum = 1, maximum = 500),
        ("after" = Option<String>, Query, description = "The previous page's nextAfter", pattern = r"^[0-9a-fA-F]{24}$"),
    ),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "A page of tokens", body = TokenPage),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Scope not allowed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_tokens(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<axum::Json<TokenPage>, ApiError> {
    principal.require(Scope::Read)?;
    let Query(pairs) =
        query.map_err(|_| ApiError::validation("query", "is not a valid query string"))?;
    let (filter, limit) = parse_list_query(&pairs)?;
    let filter = TokenQuery {
        accounts: principal.accounts().map(<[String]>::to_vec),
        ..filter
    };
    let (tokens, next) = state.issuer.store().list_tokens(&filter, limit).await?;
    Ok(axum::Json(TokenPage {
        items: tokens.into_iter().map(TokenView::from).collect(),
        next_after: next.map(|id| id.to_hex()),
    }))
}

/// Parses the listing's query parameters, rejecting unknown and repeated ones.
fn parse_list_query(pairs: &[(String, String)]) -> Result<(TokenQuery, u32), ApiError> {
    let mut errors = FieldErrors::default();
    let mut query = TokenQuery::default();
    let mut limit = DEFAULT_LIMIT;
    let mut seen = Vec::new();
    for (name, value) in pairs {
        if seen.contains(name) {
            errors.push(name, "must be given at most once");
            continue;
        }
        seen.push(name.clone());
        match name.as_str() {
            "owner" => query.owner = errors.check("owner", Owner::parse(value)),
            "tokenType" => query.token_type = errors.check("tokenType", TokenType::parse(value)),
            "status" => query.status = errors.check("status", TokenStatus::parse(value)),
            "after" => {
                query.after = errors
                    .check(
                        "after",
                        TokenId::parse(value).map_err(|_| "must be a nextAfter value".to_owned()),
                    )
                    .map(TokenId::object_id)
            }
            "limit" => {
                let parsed = value
                    .parse::<u32>()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| format!("must be an integer from 1 to {MAX_LIMIT}"));
                limit = errors.check("limit", parsed).unwrap_or(DEFAULT_LIMIT);
            }
            _ => errors.push(name, "is not a known query parameter"),
        }
    }
    errors.finish().map_err(ApiError::Validation)?;
    Ok((query, limit))
}

/// Redeem an active token.
///
/// With `If-Match` the given version is the gate (412 if stale). `If-Match` uses RFC 9110's
/// strong comparison: `W/"3"` never matches; `*` matches any version of an existing token
/// (the write then gates on the version just read); a list matches if any entry does.
/// Without it the server re-reads and retries a lost race with backoff, then answers 409.
/// Redeeming a redeemed or revoked token is 409 `state_conflict`.
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/redeem", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id", pattern = r"^[0-9a-fA-F]{24}$"),
        ("If-Match" = Option<String>, Header, description = "The version the change is based on, e.g. \"3\"; or `*` (any version: the write gates on the version read), or a list (`\"1\", \"3\"`) of which any may match. Compared strongly: a weak tag (`W/\"3\"`) never matches (412)", nullable = false, pattern = r#"^[ \t]*(\*|(W/)?("[0-9]{1,18}"|[0-9]{1,18})([ \t]*,[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18}))*)[ \t]*$"#),
    ),
    request_body(content = Option<RedeemRequest>, description = "Optional; an empty body is fine"),
    security(("bearer" = ["tokens:redeem"])),
    responses(
        (status = 200, description = "Redeemed", body = TokenView, headers(("ETag" = String, description = "The new version"))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Scope not allowed", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`state_conflict`: not active, or kept changing", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`version_conflict`: If-Match is stale; the body has currentVersion and currentStatus", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad token id, body or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn redeem_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    Path(token_id): Path<String>,
    headers: HeaderMap,
    body: Result<OptionalJsonBody<RedeemRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(Scope::TokensRedeem)?;
    let OptionalJsonBody(body) = body?;
    let condition = if_match(&headers)?;
    let reference = note("reference", body.reference)?;
    apply(
        &state,
        &principal,
        &token_id,
        Transition::Redeem { reference },
        condition,
    )
    .await
}

/// Revoke a token.
///
/// Revoking a revoked token is 200 with the version unchanged; revoking a redeemed token
/// is 409 `state_conflict`. `If-Match` works as for redeem.
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/revoke", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id", pattern = r"^[0-9a-fA-F]{24}$"),
        ("If-Match" = Option<String>, Header, description = "The version the change is based on, e.g. \"3\"; or `*` (any version: the write gates on the version read), or a list (`\"1\", \"3\"`) of which any may match. Compared strongly: a weak tag (`W/\"3\"`) never matches (412)", nullable = false, pattern = r#"^[ \t]*(\*|(W/)?("[0-9]{1,18}"|[0-9]{1,18})([ \t]*,[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18}))*)[ \t]*$"#),
    ),
    request_body(content = Option<RevokeRequest>, description = "Optional; an empty body is fine"),
    security(("bearer" = ["tokens:revoke"])),
    responses(
        (status = 200, description = "Revoked (or already revoked)", body = TokenView, headers(("ETag" = String, description = "The version"))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Scope not allowed", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`state_conflict`: redeemed, or kept changing", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`version_conflict`", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad token id, body or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    Path(token_id): Path<String>,
    headers: HeaderMap,
    body: Result<OptionalJsonBody<RevokeRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(Scope::TokensRevoke)?;
    let OptionalJsonBody(body) = body?;
    let condition = if_match(&headers)?;
    let reason = note("reason", body.reason)?;
    apply(
        &state,
        &principal,
        &token_id,
        Transition::Revoke { reason },
        condition,
    )
    .await
}

/// Transfer an active token to a new owner. `If-Match` is required (428 without).
#[utoipa::path(
    post, path = "/v1/tokens/{tokenId}/transfer", tag = "tokens",
    params(
        ("tokenId" = String, Path, description = "24-hex token id", pattern = r"^[0-9a-fA-F]{24}$"),
        ("If-Match" = String, Header, description = "The version the transfer is based on, e.g. \"3\"; or `*`, or a list, as for redeem. Compared strongly: a weak tag (`W/\"3\"`) never matches (412)", pattern = r#"^[ \t]*(\*|(W/)?("[0-9]{1,18}"|[0-9]{1,18})([ \t]*,[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18}))*)[ \t]*$"#),
    ),
    request_body = TransferRequest,
    security(("bearer" = ["tokens:transfer"])),
    responses(
        (status = 200, description = "Transferred", body = TokenView, headers(("ETag" = String, description = "The new version"))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or unknown API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Scope not allowed", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`state_conflict`: not active", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`version_conflict`", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad token id, newOwner or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "`precondition_required`: If-Match missing", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Seconds to wait"))),
        (status = 503, description = "`database_unavailable` or `request_timeout`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn transfer_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    Path(token_id): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody<TransferRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(Scope::TokensTransfer)?;
    let JsonBody(body) = body?;
    let new_owner = match body.new_owner.as_deref() {
        Some(owner) => Owner::parse(owner).map_err(|m| ApiError::validation("newOwner", m))?,
        None => return Err(ApiError::validation("newOwner", "is required")),
    };
    let condition = if_match(&headers)?.ok_or(ApiError::PreconditionRequired(
        "A transfer needs If-Match with the token's current ETag.",
    ))?;
    let transition = Transition::Transfer { new_owner };
    apply(&state, &principal, &token_id, transition, Some(condition)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(value: &str) -> Result<Option<IfMatch>, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_MATCH, HeaderValue::from_str(value).unwrap());
        if_match(&headers)
    }

    fn strong(version: i64) -> EntityTag {
        EntityTag {
            weak: false,
            version,
        }
    }

    fn weak(version: i64) -> EntityTag {
        EntityTag {
            weak: true,
            version,
        }
    }

    fn tags(value: &str) -> Vec<EntityTag> {
        match parsed(value) {
            Ok(Some(IfMatch::Tags(tags))) => tags,
            other => panic!("{value:?}: {other:?}"),
        }
    }

    #[test]
    fn if_match_accepts_exactly_the_documented_forms() {
        assert!(matches!(if_match(&HeaderMap::new()), Ok(None)));
        for (value, tag) in [
            ("\"3\"", strong(3)),
            ("W/\"3\"", weak(3)),
            ("3", strong(3)),
            ("W/0", weak(0)),
            (" \"7\"\t", strong(7)),
        ] {
            assert_eq!(tags(value), [tag], "{value}");
        }
        assert_eq!(tags(&"9".repeat(18)), [strong(999_999_999_999_999_999)]);
        assert_eq!(parsed("*").unwrap(), Some(IfMatch::Any));
        assert_eq!(parsed(" * ").unwrap(), Some(IfMatch::Any));
        assert_eq!(
            tags("\"1\", W/\"2\",3 ,\t\"4\""),
            [strong(1), weak(2), strong(3), strong(4)]
        );
        // Found by scripts/fuzz-api.sh: the old parser took `+3`, `""3""` or `W/W/3`,
        // which openapi.yaml's pattern refuses.
        for bad in [
            "",
            " ",
            "\"\"",
            "\"",
            "+3",
            "-1",
            "\"3",
            "\"\"3\"\"",
            "W/W/3",
            "w/\"3\"",
            "3 4",
            "null",
            "**",
            "*, \"1\"",
            "\"1\",",
            ",\"1\"",
            "\"1\",,\"2\"",
            "\"abc\"",
            &"9".repeat(19),
        ] {
            assert!(
                matches!(parsed(bad), Err(ApiError::Validation(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn several_if_match_lines_are_one_list() {
        let mut headers = HeaderMap::new();
        headers.append(header::IF_MATCH, HeaderValue::from_static("\"1\""));
        headers.append(header::IF_MATCH, HeaderValue::from_static("W/\"2\", \"3\""));
        assert_eq!(
            if_match(&headers).unwrap(),
            Some(IfMatch::Tags(vec![strong(1), weak(2), strong(3)]))
        );
        headers.append(header::IF_MATCH, HeaderValue::from_static("*"));
        assert!(if_match(&headers).is_err(), "`*` is alone or not at all");
    }

    #[test]
    fn if_match_compares_strongly() {
        let any = IfMatch::Any;
        assert!(any.matches(0) && any.matches(41));
        assert_eq!(any.sole_version(), None);

        let one = IfMatch::Tags(vec![strong(3)]);
        assert!(one.matches(3) && !one.matches(2));
        assert_eq!(one.sole_version(), Some(3));

        let weak_only = IfMatch::Tags(vec![weak(3)]);
        assert!(!weak_only.matches(3), "a weak tag never matches");
        assert_eq!(weak_only.sole_version(), None);

        let list = IfMatch::Tags(vec![strong(1), weak(2), strong(3)]);
        assert!(list.matches(1) && list.matches(3));
        assert!(!list.matches(2) && !list.matches(4));
        assert_eq!(list.sole_version(), None);
    }

    #[test]
    fn the_documented_pattern_is_the_parsers() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::http::ApiDoc::openapi()).unwrap();
        for operation in ["redeem", "revoke", "transfer"] {
            let parameters =
                &doc["paths"][format!("/v1/tokens/{{tokenId}}/{operation}")]["post"]["parameters"];
            let if_match = parameters
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "If-Match")
                .unwrap();
            assert_eq!(
                if_match["schema"]["pattern"], IF_MATCH_PATTERN,
                "{operation}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::parsed;
        use crate::http::tokens::IF_MATCH_PATTERN;

        fn element() -> impl Strategy<Value = String> {
            prop_oneof![
                "(W/)?\"[0-9]{1,19}\"",
                "(W/)?[0-9]{1,19}",
                r#"[W/" *,0-9a-z+-]{0,6}"#,
            ]
        }

        proptest! {
            /// The parser accepts exactly what openapi.yaml's pattern accepts.
            #[test]
            fn parser_and_pattern_agree(
                elements in prop::collection::vec(element(), 1..4),
                separators in prop::collection::vec("[ \t]{0,2},[ \t]{0,2}|,|[ \t]", 3),
                edges in ("[ \t]{0,2}", "[ \t]{0,2}"),
            ) {
                let mut value = edges.0.clone();
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        value.push_str(&separators[i - 1]);
                    }
                    value.push_str(element);
                }
                value.push_str(&edges.1);
                let pattern = regex::Regex::new(IF_MATCH_PATTERN).unwrap();
                prop_assert_eq!(parsed(&value).is_ok(), pattern.is_match(&value), "{:?}", value);
            }
        }
    }
}
