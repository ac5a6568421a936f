//! The `payments` projection: each payment's state as its provider last reported it,
//! written by a version-gated pipeline upsert. The filter is the unique key only; whether
//! the incoming event is newer is decided inside the update, atomically, by `$cond` over
//! `$$ROOT`, so an older event never overwrites a newer one whatever order or concurrency
//! they arrive in. An older event still contributes the facts the state lacks (token
//! metadata, amount, date). Refunds are recorded apart from the state, one amount per
//! refund id, because they only grow and add up whatever order they arrive in.

use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;
use serde::Deserialize;

use super::documents::{bson_time, from_document};
use super::error::StoreError;
use super::filters::{issuance_filter, payment_tokens_filter};
use super::indexes::PAYMENTS_INDEX;
use super::{Store, TOKENS};
use crate::domain::{
    Actor, IssuanceParams, Owner, PaymentEvent, PaymentKey, PaymentStatus, Quantity, TokenType,
};

pub const PAYMENTS: &str = "payments";

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
    /// As last reported; `processing` while only a partial refund has been heard of.
    #[serde(default = "status_before_any_event")]
    pub status: PaymentStatus,
    /// 0 while only a partial refund has been heard of (it is no state change).
    #[serde(default)]
    pub version: i64,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    pub token_params: Option<TokenParamsDoc>,
    /// Why the metadata could not be used, when it could not.
    pub metadata_error: Option<String>,
    pub payment_date: Option<DateTime>,
    /// The sum of the payment's refunds (`refunds`: one `{id, amount}` per refund,
    /// dispute or charge); it only grows.
    pub amount_refunded: Option<i64>,
    #[serde(default)]
    pub last_event_id: String,
    #[serde(default)]
    pub last_event_type: String,
    pub created_at: DateTime,
    pub updated_at: DateTime,
}

fn status_before_any_event() -> PaymentStatus {
    PaymentStatus::Processing
}

impl PaymentDoc {
    /// The payment's unique key, as stored (validated when it was written).
    pub fn key(&self) -> Result<PaymentKey, StoreError> {
        super::documents::stored_key(&self.provider, &self.account_id, &self.payment_intent_id)
    }
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
        // What a newer event sets, and what any event fills in where the state has nothing.
        let mut newer_sets = doc! {
            "status": literal(event.status.as_str()),
            "version": literal(event.version),
            "lastEventId": literal(event.event_id.as_str()),
            "lastEventType": literal(event.event_type.as_str()),
            "updatedAt": "$$NOW",
        };
        let mut facts = Document::new();
        if let Some(amount) = event.amount {
            facts.insert("amount", amount);
        }
        if let Some(currency) = &event.currency {
            facts.insert("currency", currency.as_str());
        }
        if let Some(date) = event.payment_date {
            facts.insert("paymentDate", bson_time(date));
        }
        match &event.token_params {
            Some(Ok(params)) => {
                facts.insert(
                    "tokenParams",
                    doc! {
                        "owner": params.owner.object_id(),
                        "tokenType": params.token_type.as_str(),
                        "quantity": i64::from(params.quantity.get()),
                    },
                );
                newer_sets.insert("metadataError", literal(Bson::Null));
            }
            // Invalid metadata in a newer event voids older parameters: nobody may issue
            // from metadata the provider has since replaced with something unusable.
            Some(Err(reason)) => {
                newer_sets.insert("metadataError", literal(reason.as_str()));
                newer_sets.insert("tokenParams", literal(Bson::Null));
            }
            None => {}
        }
        let mut filled = doc! { "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] } };
        for (field, value) in &facts {
            newer_sets.insert(field.clone(), literal(value.clone()));
            // An older event fills a gap only; metadata only if none was ever judged.
            let current = format!("${field}");
            let gap = if field == "tokenParams" {
                doc! { "$and": [
                    { "$eq": [ { "$ifNull": [&current, Bson::Null] }, Bson::Null ] },
                    { "$eq": [ { "$ifNull": ["$metadataError", Bson::Null] }, Bson::Null ] },
                ] }
            } else {
                doc! { "$eq": [ { "$ifNull": [&current, Bson::Null] }, Bson::Null ] }
            };
            filled.insert(
                field.clone(),
                doc! { "$cond": [gap, literal(value.clone()), &current] },
            );
        }
        let newer = doc! { "$or": [
            { "$eq": [ { "$type": "$version" }, "missing" ] },
            { "$lt": [ "$version", literal(event.version) ] },
        ] };
        let pipeline = vec![
            doc! { "$replaceWith": { "$cond": [
                newer,
                { "$mergeObjects": [ "$$ROOT", newer_sets ] },
                "$$ROOT",
            ] } },
            // Runs after the gate: fills what is still missing.
            doc! { "$set": filled },
        ];
        self.upsert_payment(&event.key, pipeline).await
    }

    /// Records `refund` (of `amount`, when the event names the payment's amount) and
    /// nothing else about the payment: it neither moves the status nor consumes a version
    /// an older state event would then lose to. The payment keeps one amount per refund
    /// id in `refunds`, each only growing, and `amountRefunded` is their sum: two refunds
    /// add up, a redelivered or replayed one counts once. `amountRefunded` never shrinks,
    /// so a total recorded before `refunds` existed is kept.
    pub async fn record_refund(
        &self,
        key: &PaymentKey,
        refund_id: &str,
        refund_amount: i64,
        amount: Option<i64>,
    ) -> Result<PaymentDoc, StoreError> {
        let id = literal(refund_id);
        let others = doc! { "$filter": {
            "input": { "$ifNull": ["$refunds", []] },
            "cond": { "$ne": ["$$this.id", id.clone()] },
        } };
        let known = doc! { "$max": { "$map": {
            "input": { "$filter": {
                "input": { "$ifNull": ["$refunds", []] },
                "cond": { "$eq": ["$$this.id", id.clone()] },
            } },
            "in": "$$this.amount",
        } } };
        let mut set = doc! {
            "refunds": { "$concatArrays": [
                others,
                [ { "id": id, "amount": { "$max": [known, literal(refund_amount)] } } ],
            ] },
            "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] },
            "updatedAt": "$$NOW",
        };
        if let Some(amount) = amount {
            set.insert("amount", doc! { "$ifNull": ["$amount", literal(amount)] });
        }
        let total = doc! { "$set": { "amountRefunded": { "$max": [
            { "$ifNull": ["$amountRefunded", 0_i64] },
            { "$sum": "$refunds.amount" },
        ] } } };
        self.upsert_payment(key, vec![doc! { "$set": set }, total])
            .await
    }

    /// Runs `pipeline` as an upsert on the payment's document; returns it as it now is.
    async fn upsert_payment(
        &self,
        key: &PaymentKey,
        pipeline: Vec<Document>,
    ) -> Result<PaymentDoc, StoreError> {
        let state = self
            .upsert_one(
                PAYMENTS,
                PAYMENTS_INDEX,
                issuance_filter(key),
                pipeline,
                ReturnDocument::After,
            )
            .await?
            .ok_or_else(|| StoreError::Internal("payment upsert returned nothing".to_owned()))?;
        from_document(state)
    }

    pub async fn find_payment(&self, key: &PaymentKey) -> Result<Option<PaymentDoc>, StoreError> {
        let found = self
            .collection(PAYMENTS)
            .find_one(issuance_filter(key))
            .await?;
        found.map(from_document).transpose()
    }

    /// Revokes the active tokens of a payment whose tokenIndex is `from_index` or more;
    /// redeemed ones stay redeemed. Each token is written only while `active` and gets
    /// `$inc: {_version: 1}`, so a concurrent version-gated redeem either happened first
    /// (and is kept) or sees the new version. `by` is recorded as `lastChangedBy`.
    /// Returns (revoked now, redeemed in the range).
    pub async fn revoke_tokens_from(
        &self,
        key: &PaymentKey,
        from_index: i64,
        reason: &str,
        by: &Actor,
    ) -> Result<(u64, u64), StoreError> {
        let now = DateTime::now();
        let in_range = |status: &str| {
            let mut filter = payment_tokens_filter(key);
            filter.insert("tokenIndex", doc! { "$gte": from_index });
            filter.insert("status", status);
            filter
        };
        let revoked = self
            .collection(TOKENS)
            .update_many(
                in_range("active"),
                doc! {
                    "$set": {
                        "status": "revoked",
                        "revokedAt": now,
                        "revocationReason": reason,
                        "lastChangedBy": by.as_str(),
                        "updatedAt": now,
                    },
                    "$inc": { "_version": 1 },
                },
            )
            .await?
            .modified_count;
        let redeemed = self
            .collection(TOKENS)
            .count_documents(in_range("redeemed"))
            .await?;
        Ok((revoked, redeemed))
    }
}
