//! `GET /v1/payments/{provider}/{accountId}/{paymentIntentId}`: the payment's state as its
//! provider last reported it (the projection of webhook events).

use std::sync::Arc;

use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::extract::PathParams;
use super::payment_path::PaymentPath;
use crate::domain::PaymentStatus;
use crate::domain::Scope;
use crate::store::{PaymentDoc, chrono_time};

/// A payment as tokenmint knows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentView {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub status: PaymentStatus,
    /// Monotonic: the provider's object version (Standard Webhooks), or for Stripe
    /// status rank × 10¹⁰ + the event's `created`.
    pub version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The token parameters from the payment's metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<i64>,
    /// Why the metadata could not be used, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_error: Option<String>,
    pub last_event_id: String,
    pub last_event_type: String,
    pub updated_at: DateTime<Utc>,
}

impl From<PaymentDoc> for PaymentView {
    fn from(p: PaymentDoc) -> Self {
        let params = p.token_params.as_ref();
        Self {
            provider: p.provider,
            account_id: p.account_id,
            payment_intent_id: p.payment_intent_id,
            status: p.status,
            version: p.version,
            amount: p.amount,
            currency: p.currency,
            owner: params.map(|t| t.owner.to_hex()),
            token_type: params.map(|t| t.token_type.clone()),
            quantity: params.map(|t| t.quantity),
            metadata_error: p.metadata_error,
            last_event_id: p.last_event_id,
            last_event_type: p.last_event_type,
            updated_at: chrono_time(p.updated_at),
        }
    }
}

/// Read a payment's state.
#[utoipa::path(
    get, path = "/v1/payments/{provider}/{accountId}/{paymentIntentId}", tag = "payments",
    params(PaymentPath),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The payment", body = PaymentView),
        (status = 404, description = "No event for this payment yet (or not visible to this key)"),
        (status = 422, description = "Malformed path parameter"),
    )
)]
pub async fn get_payment(
    State(state): State<AppState>,
    principal: Arc<Principal>,
    PathParams(path): PathParams<PaymentPath>,
) -> Result<axum::Json<PaymentView>, ApiError> {
    principal.require(Scope::Read)?;
    let key = path.visible_key(&principal, "No event has been received for this payment.")?;
    let not_found =
        || ApiError::NotFound("No event has been received for this payment.".to_owned());
    let payment = state
        .issuer
        .store()
        .find_payment(&key)
        .await?
        .ok_or_else(not_found)?;
    Ok(axum::Json(PaymentView::from(payment)))
}
