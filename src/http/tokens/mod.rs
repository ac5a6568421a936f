//! `/v1/tokens`: read, list, and change a token's state through the version gate.
//! `ETag` and `If-Match` carry the token's `_version`, quoted (`"3"`). Reads are here,
//! the state changes in `changes`, the `If-Match` precondition in `if_match`.

mod changes;
mod if_match;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

pub(crate) use if_match::IF_MATCH_PATTERN;

pub use changes::{
    __path_redeem_token, __path_revoke_token, __path_transfer_token, REDEEM_SCOPE, REVOKE_SCOPE,
    TRANSFER_SCOPE, redeem_token, revoke_token, transfer_token,
};

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::idempotency::{json_answer, respond};
use crate::domain::{FieldErrors, Owner, Scope, TokenId, TokenStatus, TokenType};
use crate::http::extract::{PathParams, QueryParameters};
use crate::issuing::Answer;
use crate::store::{TokenDoc, TokenQuery, chrono_time};

/// Listing page size: default and maximum.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;

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
    /// Who made the last change: `key:<API key id>`, `provider:<name>` (a refund,
    /// cancellation or chargeback the provider reported) or `tokenmint:repair`. Absent
    /// until the token first changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_changed_by: Option<String>,
}

impl From<crate::store::Origin> for OriginView {
    fn from(origin: crate::store::Origin) -> Self {
        Self {
            provider: origin.provider,
            account_id: origin.account_id,
            payment_intent_id: origin.payment_intent_id,
            date: chrono_time(origin.date),
        }
    }
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
            origin: OriginView::from(t.origin),
            created_at: chrono_time(t.created_at),
            updated_at: chrono_time(t.updated_at),
            redeemed_at: t.redeemed_at.map(chrono_time),
            redemption_ref: t.redemption_ref,
            revoked_at: t.revoked_at.map(chrono_time),
            revocation_reason: t.revocation_reason,
            last_changed_by: t.last_changed_by,
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

/// The token with its `ETag`, as answered and as kept for an `Idempotency-Key`.
pub(super) fn token_answer(token: &TokenDoc) -> Answer {
    let etag = format!("\"{}\"", token.version);
    json_answer(
        StatusCode::OK,
        &[(header::ETAG, etag)],
        &TokenView::from(token.clone()),
    )
}

/// The token with its `ETag`.
pub(super) fn token_response(token: &TokenDoc) -> Response {
    respond(token_answer(token))
}

pub(super) fn parse_token_id(raw: &str) -> Result<TokenId, ApiError> {
    TokenId::parse(raw).map_err(|message| ApiError::validation("tokenId", message))
}

pub(super) fn not_found() -> ApiError {
    ApiError::NotFound("No such token.".to_owned())
}

/// The token `id` if it exists and `principal` may see it; else 404, the same either way,
/// so that a key learns nothing of the tokens of accounts it is not granted.
pub(super) async fn find_visible_token(
    state: &AppState,
    principal: &Principal,
    id: TokenId,
) -> Result<TokenDoc, ApiError> {
    state
        .issuer
        .store()
        .find_token(id)
        .await?
        .filter(|t| principal.can_see(&t.origin.provider, &t.origin.account_id))
        .ok_or_else(not_found)
}

/// Read a token.
#[utoipa::path(
    get, path = "/v1/tokens/{tokenId}", tag = "tokens",
    params(("tokenId" = String, Path, description = "24-hex token id")),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The token", body = TokenView,
            headers(("ETag" = String, description = "The quoted version, e.g. \"3\""))),
        (status = 404, description = "No such token (or not visible to this key)"),
        (status = 422, description = "Malformed token id"),
    )
)]
pub async fn get_token(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    PathParams(token_id): PathParams<String>,
) -> Result<Response, ApiError> {
    principal.require(Scope::Read)?;
    let id = parse_token_id(&token_id)?;
    let token = find_visible_token(&state, &principal, id).await?;
    Ok(token_response(&token))
}

/// List tokens, oldest first, with a cursor.
///
/// Paging follows `_id`: a walk with `after = nextAfter` visits every token that existed
/// when it began exactly once, even while new tokens are being issued.
#[utoipa::path(
    get, path = "/v1/tokens", tag = "tokens",
    params(
        ("owner" = Option<String>, Query, description = "Only this owner's tokens (24-hex)"),
        ("tokenType" = Option<String>, Query, description = "Only this token type"),
        ("status" = Option<TokenStatus>, Query, description = "Only tokens in this state"),
        ("limit" = Option<u32>, Query, description = "Page size, 1–500, default 50", minimum = 1, maximum = 500),
        ("after" = Option<String>, Query, description = "The previous page's nextAfter"),
    ),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "A page of tokens", body = TokenPage),
        (status = 422, description = "Bad query parameter"),
    )
)]
pub async fn list_tokens(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    query: Result<QueryParameters, ApiError>,
) -> Result<axum::Json<TokenPage>, ApiError> {
    principal.require(Scope::Read)?;
    let (filter, limit) = parse_list_query(&query?)?;
    let filter = TokenQuery {
        accounts: principal
            .accounts()
            .map(<[crate::domain::AccountGrant]>::to_vec),
        ..filter
    };
    let (tokens, next) = state.issuer.store().list_tokens(&filter, limit).await?;
    Ok(axum::Json(TokenPage {
        items: tokens.into_iter().map(TokenView::from).collect(),
        next_after: next.map(|id| id.to_hex()),
    }))
}

/// Parses the listing's query parameters, rejecting unknown and repeated ones.
fn parse_list_query(parameters: &QueryParameters) -> Result<(TokenQuery, u32), ApiError> {
    let mut errors = FieldErrors::default();
    let mut query = TokenQuery::default();
    let mut limit = DEFAULT_LIMIT;
    parameters.parse(&mut errors, |name, value, errors| {
        match name {
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
            _ => return false,
        }
        true
    });
    errors.finish().map_err(ApiError::Validation)?;
    Ok((query, limit))
}
