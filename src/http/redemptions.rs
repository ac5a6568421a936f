//! `POST /v1/redemptions` (spend an amount of an owner's tokens, all or nothing, named by
//! a reference) and `GET /v1/redemptions/{owner}/{reference}`. The rules are
//! `issuing::redemptions`'; this parses, checks the key, and shapes the answers (one
//! shape, `redemption_answer`, for the answer sent and the one an `Idempotency-Key`
//! keeps).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::extract::{JsonBody, PathParams};
use super::idempotency::{IDEMPOTENT_REPLAYED, json_answer, respond, transient};
use super::openapi::IDEMPOTENCY_KEY_DOC;
use super::tokens::OriginView;
use crate::domain::{
    AccountId, Actor, FieldErrors, NewRedemption, Owner, Quantity, RedemptionReference, Scope,
    TokenStatus, TokenType,
};
use crate::issuing::{Answer, Attempt, Keyed, Redeemed, RedemptionError, RedemptionOutcome};
use crate::store::{TokenDoc, chrono_time};

/// Where redemptions are created.
const REDEMPTIONS_PATH: &str = "/v1/redemptions";

/// Body of `POST /v1/redemptions`; every bad field is reported in one 422.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedemptionRequest {
    /// Whose tokens: 24-hex ObjectId.
    #[schema(value_type = String, required = true, example = "65f1a0c2b3d4e5f601234567")]
    owner: Option<Value>,
    /// `^[a-z0-9][a-z0-9_.-]{0,63}$`.
    #[schema(value_type = String, required = true, example = "standard")]
    token_type: Option<Value>,
    /// How many tokens to redeem: an integer from 1 to `issuance.max_quantity`.
    #[schema(value_type = i64, required = true, minimum = 1, maximum = 10000, example = 3)]
    quantity: Option<Value>,
    /// The client's name for this redemption, unique per owner: `^[A-Za-z0-9_.:-]{1,128}$`.
    #[schema(value_type = String, required = true, example = "order-42")]
    reference: Option<Value>,
    /// Spend only tokens of this merchant account; default: any account of the key.
    #[schema(value_type = Option<String>, required = false, example = "acct_1")]
    account_id: Option<Value>,
}

impl RedemptionRequest {
    /// Validates every field, reporting all bad ones together with `errors` (the body's
    /// unknown fields).
    fn into_domain(
        self,
        mut errors: FieldErrors,
        max_quantity: u32,
        by: Actor,
    ) -> Result<NewRedemption, ApiError> {
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
        let reference = errors.required_text(
            "reference",
            self.reference.as_ref(),
            RedemptionReference::parse,
        );
        let account_id =
            errors.optional_text("accountId", self.account_id.as_ref(), AccountId::parse);
        errors.finish().map_err(ApiError::Validation)?;
        match (owner, token_type, quantity, reference, account_id) {
            (Some(owner), Some(token_type), Some(quantity), Some(reference), Some(account_id)) => {
                Ok(NewRedemption {
                    owner,
                    token_type,
                    quantity,
                    reference,
                    account_id,
                    requested_by: by,
                })
            }
            // Unreachable: every None above recorded an error.
            _ => Err(ApiError::Internal),
        }
    }
}

/// A redemption as clients see it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedemptionView {
    pub owner: String,
    pub token_type: String,
    pub quantity: i64,
    pub reference: String,
    /// The account the request narrowed the tokens to, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A token a redemption redeemed.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedeemedTokenView {
    pub id: String,
    pub token_index: i64,
    pub status: TokenStatus,
    pub version: i64,
    pub origin: OriginView,
}

impl From<TokenDoc> for RedeemedTokenView {
    fn from(t: TokenDoc) -> Self {
        Self {
            id: t.id.to_hex(),
            token_index: t.token_index,
            status: t.status,
            version: t.version,
            origin: OriginView::from(t.origin),
        }
    }
}

/// A redemption and its tokens, oldest first.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedemptionResponse {
    pub redemption: RedemptionView,
    pub tokens: Vec<RedeemedTokenView>,
}

impl From<Redeemed> for RedemptionResponse {
    fn from(redeemed: Redeemed) -> Self {
        let record = redeemed.record;
        Self {
            redemption: RedemptionView {
                owner: record.owner.to_hex(),
                token_type: record.token_type,
                quantity: record.quantity,
                reference: record.reference,
                account_id: record.account_id,
                created_at: chrono_time(record.created_at),
            },
            tokens: redeemed
                .tokens
                .into_iter()
                .map(RedeemedTokenView::from)
                .collect(),
        }
    }
}

impl RedemptionResponse {
    fn location(&self) -> String {
        format!(
            "{REDEMPTIONS_PATH}/{}/{}",
            self.redemption.owner, self.redemption.reference
        )
    }
}

/// The answer to a redemption: 201 when it was redeemed now, 200 with
/// `Idempotent-Replayed: true` when its reference named it already; the body, and its
/// `Location`.
fn redemption_answer(status: StatusCode, redeemed: &Redeemed) -> Answer {
    let body = RedemptionResponse::from(redeemed.clone());
    let mut headers = vec![(header::LOCATION, body.location())];
    if status == StatusCode::OK {
        headers.push((IDEMPOTENT_REPLAYED, "true".to_owned()));
    }
    json_answer(status, &headers, &body)
}

/// The answer to a redemption redeemed now.
fn created_answer(redeemed: &Redeemed) -> Answer {
    redemption_answer(StatusCode::CREATED, redeemed)
}

/// The scope a redemption requires, of its handler and of the layer that answers its
/// retries (`answering_retries`), which refuses a key without it first.
pub const CREATE_SCOPE: Scope = Scope::TokensRedeem;

/// Redeem an amount of an owner's tokens.
///
/// Redeems `quantity` active tokens of the owner and type — oldest first (earliest payment
/// date, a payment's tokens in tokenIndex order), within `accountId` if given, else within
/// the key's accounts — all or nothing, in one transaction; each carries `redemptionRef` =
/// `reference`. The same request again (same owner and reference, same tokenType and
/// quantity) is 200 with the same tokens; with the first request's `Idempotency-Key` it is
/// that request's 201 and body, committed with the redemption. Another tokenType or
/// quantity with the reference is 409 `idempotency_conflict`. Fewer active tokens than
/// asked is 409 `insufficient_balance` with `available`, nothing redeemed (not kept for an
/// `Idempotency-Key`). Concurrent redemptions never redeem one token twice.
#[utoipa::path(
    post, path = "/v1/redemptions", tag = "balances",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = IDEMPOTENCY_KEY_DOC, nullable = false),
    ),
    request_body = RedemptionRequest,
    security(("bearer" = ["tokens:redeem"])),
    responses(
        (status = 201, description = "Redeemed; or, with `Idempotent-Replayed: true`, a retry with the first request's Idempotency-Key", body = RedemptionResponse,
            headers(
                ("Location" = String, description = "The redemption's GET URL"),
                ("Idempotent-Replayed" = String, description = "`true` on an Idempotency-Key's retry"))),
        (status = 200, description = "A replay by reference: the owner's redemption of this reference, with these parameters, existed", body = RedemptionResponse,
            headers(
                ("Location" = String, description = "The redemption's GET URL"),
                ("Idempotent-Replayed" = String, description = "`true`"))),
        (status = 409, description = "`idempotency_conflict`: the reference was used with another tokenType, quantity or accountId (`mismatches`); `insufficient_balance`: fewer active tokens than asked (`available`); `request_in_progress`: the first request with this Idempotency-Key is still running (`Retry-After`)",
            headers(("Retry-After" = u64, description = "With `request_in_progress`"))),
        (status = 422, description = "`validation_failed`: bad fields (all listed) or Idempotency-Key; `idempotency_key_reused`"),
        (status = 503, description = "`database_unavailable` or `request_timeout`: retry after Retry-After; `transactions_unavailable` (no Retry-After): a MongoDB without transactions, which redemptions need and a retry does not change",
            headers(("Retry-After" = u64, description = "With `database_unavailable` and `request_timeout`"))),
    )
)]
pub async fn create_redemption(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    attempt: Option<Extension<Arc<Attempt>>>,
    body: Result<JsonBody<RedemptionRequest>, ApiError>,
) -> Result<Response, ApiError> {
    principal.require(CREATE_SCOPE)?;
    let attempt = attempt.map(|Extension(attempt)| attempt);
    let JsonBody(body, errors) = body?;
    let request = body.into_domain(
        errors,
        state.max_quantity,
        Actor::api_key(&principal.key_id),
    )?;
    if let (Some(account), Some(grants)) = (&request.account_id, principal.accounts())
        && !grants.iter().any(|g| g.account() == account)
    {
        return Err(ApiError::Forbidden(format!(
            "This API key is not allowed for account `{account}`."
        )));
    }
    let keyed = attempt.as_deref().map(|attempt| Keyed {
        attempt,
        answer: &created_answer,
    });
    let outcome = state
        .issuer
        .redeem_amount(
            &request,
            principal.accounts(),
            |t| principal.can_see(&t.origin.provider, &t.origin.account_id),
            keyed,
        )
        .await;
    let answer = match outcome {
        Ok(RedemptionOutcome::Created(redeemed)) => created_answer(&redeemed),
        Ok(RedemptionOutcome::Replayed(redeemed)) => redemption_answer(StatusCode::OK, &redeemed),
        // More tokens may come: the same request may pass later, so it is not kept.
        Err(err @ RedemptionError::Insufficient { .. }) => {
            return Ok(transient(ApiError::from(err)));
        }
        Err(err) => return Err(err.into()),
    };
    Ok(respond(answer))
}

/// Read a redemption and its tokens.
#[utoipa::path(
    get, path = "/v1/redemptions/{owner}/{reference}", tag = "balances",
    params(
        ("owner" = String, Path, description = "The owner (24-hex ObjectId)"),
        ("reference" = String, Path, description = "The redemption's reference"),
    ),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The redemption and its tokens, oldest first", body = RedemptionResponse),
        (status = 404, description = "No such redemption (or one with tokens this key may not see)"),
        (status = 422, description = "Bad owner or reference"),
    )
)]
pub async fn get_redemption(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    PathParams((owner, reference)): PathParams<(String, String)>,
) -> Result<axum::Json<RedemptionResponse>, ApiError> {
    principal.require(Scope::Read)?;
    let mut errors = FieldErrors::default();
    let owner = errors.check("owner", Owner::parse(&owner));
    let reference = errors.check("reference", RedemptionReference::parse(&reference));
    errors.finish().map_err(ApiError::Validation)?;
    let (Some(owner), Some(reference)) = (owner, reference) else {
        return Err(ApiError::Internal);
    };
    let found = state
        .issuer
        .find_redemption(owner.object_id(), reference.as_str(), |t| {
            principal.can_see(&t.origin.provider, &t.origin.account_id)
        })
        .await?
        .ok_or_else(|| ApiError::NotFound("No such redemption.".to_owned()))?;
    Ok(axum::Json(RedemptionResponse::from(found)))
}
