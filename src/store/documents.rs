//! The shapes of stored documents (PRODUCT.md §1), as read back from MongoDB.

use mongodb::bson::{self, DateTime, Document, doc, oid::ObjectId};
use serde::{Deserialize, Serialize};

use crate::domain::{IssuanceMode, IssuanceStatus, PaymentKey, TokenStatus};

/// Where a token came from: its payment's unique key and date.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub date: DateTime,
}

/// One document of `tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub owner: ObjectId,
    #[serde(rename = "type")]
    pub token_type: String,
    pub token_index: i64,
    pub origin: Origin,
    pub status: TokenStatus,
    /// Missing only on documents written before the `_version` backfill ran.
    #[serde(rename = "_version", default)]
    pub version: i64,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    pub redeemed_at: Option<DateTime>,
    pub redemption_ref: Option<String>,
    pub revoked_at: Option<DateTime>,
    pub revocation_reason: Option<String>,
}

/// The part of a token an issuance answer lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenSummary {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    #[serde(rename = "tokenIndex")]
    pub token_index: i64,
    pub status: TokenStatus,
    #[serde(rename = "_version", default)]
    pub version: i64,
}

/// The projection that reads a `TokenSummary`.
pub fn token_summary_projection() -> Document {
    doc! { "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1 }
}

/// One document of `issuances`: the record that arbitrates a payment's parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub owner: ObjectId,
    pub token_type: String,
    pub quantity: i64,
    pub payment_date: DateTime,
    pub mode: IssuanceMode,
    pub status: IssuanceStatus,
    pub created_at: DateTime,
}

/// The filter selecting a payment's issuance record (its unique key, nothing else).
pub fn issuance_filter(key: &PaymentKey) -> Document {
    issuance_filter_fields(key, "")
}

/// The filter selecting every token of a payment (a prefix of the unique token index).
pub fn payment_tokens_filter(key: &PaymentKey) -> Document {
    issuance_filter_fields(key, "origin.")
}

/// A payment's unique key as filter fields, under `prefix` (`""` for issuances and
/// payments, `"origin."` for tokens). Values are validated identifiers, never operators.
pub fn issuance_filter_fields(key: &PaymentKey, prefix: &str) -> Document {
    doc! {
        format!("{prefix}provider"): key.provider.as_str(),
        format!("{prefix}accountId"): key.account_id.as_str(),
        format!("{prefix}paymentIntentId"): key.payment_intent_id.as_str(),
    }
}

/// Converts a chrono time to BSON, at MongoDB's millisecond precision.
pub fn bson_time(at: chrono::DateTime<chrono::Utc>) -> DateTime {
    DateTime::from_millis(at.timestamp_millis())
}

/// Deserializes a raw document into `T`, reporting a schema mismatch as an internal error.
pub fn from_document<T: serde::de::DeserializeOwned>(
    document: Document,
) -> Result<T, super::StoreError> {
    bson::from_document(document)
        .map_err(|e| super::StoreError::Internal(format!("unexpected document shape: {e}")))
}

/// A new token of `request` as first written (`_version: 0`, status `active`), without
/// `_id`: the upsert lets the server choose it, atomic mode sets its own.
pub fn new_token(
    request: &crate::domain::NewIssuance,
    token_index: i64,
    now: DateTime,
) -> Document {
    let key = &request.key;
    doc! {
        "owner": request.params.owner.object_id(),
        "type": request.params.token_type.as_str(),
        "tokenIndex": token_index,
        "origin": {
            "provider": key.provider.as_str(),
            "accountId": key.account_id.as_str(),
            "paymentIntentId": key.payment_intent_id.as_str(),
            "date": bson_time(request.payment_date),
        },
        "status": "active",
        "_version": 0,
        "createdAt": now,
        "updatedAt": now,
    }
}

/// Converts a BSON time to chrono, for answers and for re-issuing with a recorded date.
pub fn chrono_time(at: DateTime) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or_default()
}
