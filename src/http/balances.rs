//! `GET /v1/balances/{owner}?tokenType=`: how many of an owner's tokens of each type are
//! active (spendable), redeemed and revoked, over the key's accounts. One aggregation;
//! no rule is involved, so it reads the store directly.

use std::sync::Arc;

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::extract::{PathParams, QueryParameters};
use crate::domain::{FieldErrors, Owner, Scope, TokenType};
use crate::store::BalanceRow;

/// An owner's balances, one row per token type.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalancesView {
    pub owner: String,
    pub balances: Vec<BalanceView>,
}

/// How many of the owner's tokens of one type are in each state.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalanceView {
    pub token_type: String,
    /// Spendable.
    pub active: i64,
    pub redeemed: i64,
    pub revoked: i64,
}

impl From<BalanceRow> for BalanceView {
    fn from(row: BalanceRow) -> Self {
        Self {
            token_type: row.token_type,
            active: row.active,
            redeemed: row.redeemed,
            revoked: row.revoked,
        }
    }
}

/// Read an owner's balances.
///
/// Counts the owner's tokens per type and state, over the accounts the key may see. With
/// `tokenType`, that type only: a row of zeros when the owner has none. Without it, a row
/// per type the owner has tokens of (none: an empty list), in type order.
#[utoipa::path(
    get, path = "/v1/balances/{owner}", tag = "balances",
    params(
        ("owner" = String, Path, description = "The owner (24-hex ObjectId)"),
        ("tokenType" = Option<String>, Query, description = "Only this token type"),
    ),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The balances", body = BalancesView),
        (status = 422, description = "Bad owner or query parameter"),
    )
)]
pub async fn get_balances(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    PathParams(owner): PathParams<String>,
    query: Result<QueryParameters, ApiError>,
) -> Result<axum::Json<BalancesView>, ApiError> {
    principal.require(Scope::Read)?;
    let query = query?;
    let mut errors = FieldErrors::default();
    let owner = errors.check("owner", Owner::parse(&owner));
    let mut token_type = None;
    query.parse(&mut errors, |name, value, errors| match name {
        "tokenType" => {
            token_type = errors.check("tokenType", TokenType::parse(value));
            true
        }
        _ => false,
    });
    errors.finish().map_err(ApiError::Validation)?;
    // Unreachable: a bad owner recorded an error above.
    let Some(owner) = owner else {
        return Err(ApiError::Internal);
    };
    let rows = state
        .issuer
        .store()
        .balances(owner, token_type.as_ref(), principal.accounts())
        .await?;
    let mut balances: Vec<BalanceView> = rows.into_iter().map(BalanceView::from).collect();
    if let Some(token_type) = token_type
        && balances.is_empty()
    {
        balances.push(BalanceView {
            token_type: token_type.as_str().to_owned(),
            active: 0,
            redeemed: 0,
            revoked: 0,
        });
    }
    Ok(axum::Json(BalancesView {
        owner: owner.to_string(),
        balances,
    }))
}
