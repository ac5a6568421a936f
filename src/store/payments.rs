//! The `payments` projection: each payment's state as its provider last reported it,
//! written by a version-gated pipeline upsert (seed 002). The filter is the unique key
//! only; whether the incoming event is newer is decided inside the update, atomically, by
//! `$cond` over `$$ROOT`, so an older event never overwrites a newer one whatever order or
//! concurrency they arrive in.

use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;
use serde::Deserialize;

use super::documents::{bson_time, from_document, issuance_filter, payment_tokens_filter};
use super::error::{StoreError, duplicate_key_index};
use super::{Store, TOKENS};
use crate::domain::{IssuanceParams, Owner, PaymentKey, PaymentStatus, Quantity, TokenType};
use crate::webhooks::PaymentEvent;

pub const PAYMENTS: &str = "payments";
/// The unique index on `payments` (provider, accountId, paymentIntentId).
pub const PAYMENTS_INDEX: &str = "uniq_payment";
/// Bounded retries of the first-insert duplicate-key race between two upserts.
const FIRST_INSERT_RETRIES: u32 = 3;

/// The token parameters a payment's metadata named.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenParamsDoc {
    pub owner: ObjectId,
    pub token_type: String,
    pub quantity: i64,
}

impl TokenParamsDoc {
    /// Back to domain parameters (stored values were validated when written).
    pub fn params(&self) -> Option<IssuanceParams> {
        Some(IssuanceParams {
            owner: Owner::from_object_id(self.owner),
            token_type: TokenType::parse(&self.token_type).ok()?,
            quantity: Quantity::from_i64(self.quantity, u32::MAX).ok()?,
        })
    }
}

/// One document of `payments`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentDoc {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    pub status: PaymentStatus,
    pub version: i64,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub token_params: Option<TokenParamsDoc>,
    /// Why the metadata could not be used, when it could not.
    pub metadata_error: Option<String>,
    pub payment_date: Option<DateTime>,
    pub last_event_id: String,
    pub last_event_type: String,
    pub created_at: DateTime,
    pub updated_at: DateTime,
}

/// Wraps a value so the aggregation pipeline reads it as data, never as `$field` or an
/// operator — event contents come from outside.
fn literal(value: impl Into<Bson>) -> Document {
    doc! { "$literal": value.into() }
}

impl Store {
    /// Applies `event` to its payment if it is newer than the stored state; returns the
    /// state after the update either way.
    pub async fn project_payment(&self, event: &PaymentEvent) -> Result<PaymentDoc, StoreError> {
        let mut incoming = doc! {
            "status": literal(event.status.as_str()),
            "version": literal(event.version),
            "lastEventId": literal(event.event_id.as_str()),
            "lastEventType": literal(event.event_type.as_str()),
            "updatedAt": "$$NOW",
            "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] },
        };
        // Absent fields keep their stored values (a refund event carries no metadata).
        if let Some(amount) = event.amount {
            incoming.insert("amount", literal(amount));
        }
        if let Some(currency) = &event.currency {
            incoming.insert("currency", literal(currency.as_str()));
        }
        if let Some(date) = event.payment_date {
            incoming.insert("paymentDate", literal(bson_time(date)));
        }
        match &event.token_params {
            Some(Ok(params)) => {
                incoming.insert(
                    "tokenParams",
                    literal(doc! {
                        "owner": params.owner.object_id(),
                        "tokenType": params.token_type.as_str(),
                        "quantity": i64::from(params.quantity.get()),
                    }),
                );
                incoming.insert("metadataError", literal(Bson::Null));
            }
            Some(Err(reason)) => {
                incoming.insert("metadataError", literal(reason.as_str()));
            }
            None => {}
        }
        let newer = doc! { "$or": [
            { "$eq": [ { "$type": "$version" }, "missing" ] },
            { "$lt": [ "$version", literal(event.version) ] },
        ] };
        let pipeline = vec![doc! { "$replaceWith": { "$cond": [
            newer,
            { "$mergeObjects": [ "$$ROOT", incoming ] },
            "$$ROOT",
        ] } }];
        let mut attempt = 0;
        loop {
            let result = self
                .collection(PAYMENTS)
                .find_one_and_update(issuance_filter(&event.key), pipeline.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await;
            match result {
                Ok(Some(state)) => return from_document(state),
                Ok(None) => {
                    return Err(StoreError::Internal(
                        "payment upsert returned nothing".to_owned(),
                    ));
                }
                // Two first inserts raced; the retry matches the winner and compares versions.
                Err(err)
                    if attempt < FIRST_INSERT_RETRIES
                        && duplicate_key_index(&err).as_deref() == Some(PAYMENTS_INDEX) =>
                {
                    attempt += 1;
                    metrics::counter!("tokenmint_duplicate_key_retries_total").increment(1);
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    pub async fn find_payment(&self, key: &PaymentKey) -> Result<Option<PaymentDoc>, StoreError> {
        let found = self
            .collection(PAYMENTS)
            .find_one(issuance_filter(key))
            .await?;
        found.map(from_document).transpose()
    }

    /// Revokes every active token of a payment; redeemed ones stay redeemed. Each token is
    /// written only while `active` and gets `$inc: {_version: 1}`, so a concurrent
    /// version-gated redeem either happened first (and is kept) or sees the new version.
    /// Returns (revoked now, redeemed and kept).
    pub async fn revoke_payment_tokens(
        &self,
        key: &PaymentKey,
        reason: &str,
    ) -> Result<(u64, u64), StoreError> {
        let now = DateTime::now();
        let mut active = payment_tokens_filter(key);
        active.insert("status", "active");
        let revoked = self
            .collection(TOKENS)
            .update_many(
                active,
                doc! {
                    "$set": { "status": "revoked", "revokedAt": now, "revocationReason": reason, "updatedAt": now },
                    "$inc": { "_version": 1 },
                },
            )
            .await?
            .modified_count;
        let mut redeemed = payment_tokens_filter(key);
        redeemed.insert("status", "redeemed");
        let kept = self.collection(TOKENS).count_documents(redeemed).await?;
        Ok((revoked, kept))
    }
}
