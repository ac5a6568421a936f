//! The `payments` projection: each payment's state as its provider last reported it,
//! written by a version-gated pipeline upsert. The filter is the unique key only; whether
//! the incoming event is newer is decided inside the update, atomically, by `$cond` over
//! `$$ROOT`, so an older event never overwrites a newer one whatever order or concurrency
//! they arrive in. An older event still contributes the facts the state lacks (token
//! metadata, amount, date). On top of the version, the caller's [`ProjectionGate`] names
//! when the event changes nothing at all; the store only executes it. Refunds are recorded
//! apart from the state, one amount per refund id, because they only grow and add up
//! whatever order they arrive in.

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

/// The field that carries, for the length of one projection, whether its gate held the
/// event back; never stored.
const HELD_BACK: &str = "_heldBack";

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
    /// The event whose metadata fixed `token_params` for good (see
    /// [`ProjectionGate::fixes_params`]); no event rewrites them after it.
    pub token_params_fixed_by: Option<String>,
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

/// When [`Store::project_payment`] applies an event: the conditions, chosen by the caller,
/// under which the event changes nothing at all (neither state nor facts), evaluated on
/// the stored document inside the update.
#[derive(Debug, Clone, Copy)]
pub struct ProjectionGate<'a> {
    /// The stored statuses a newer event may move the payment on from (a payment without
    /// a status reads as `processing`); from any other, it changes nothing.
    pub moves_from: &'a [PaymentStatus],
    /// Whether the event's valid metadata fixes the payment's parameters when it is
    /// written (`tokenParamsFixedBy`: the event id). Fixed parameters are never rewritten,
    /// nor voided, by any later event.
    pub fixes_params: bool,
    /// Whether the event changes nothing when the payment's parameters are fixed and the
    /// event names others (or invalid ones).
    pub bound_to_fixed_params: bool,
}

/// Wraps a value so the aggregation pipeline reads it as data, never as `$field` or an
/// operator — event contents come from outside.
fn literal(value: impl Into<Bson>) -> Document {
    doc! { "$literal": value.into() }
}

impl Store {
    /// Applies `event` to its payment if it is newer than the stored state and `gate`
    /// lets it through; returns the state after the update either way (unchanged when the
    /// gate held the event back).
    pub async fn project_payment(
        &self,
        event: &PaymentEvent,
        gate: ProjectionGate<'_>,
    ) -> Result<PaymentDoc, StoreError> {
        let fixed =
            doc! { "$ne": [ { "$ifNull": ["$tokenParamsFixedBy", Bson::Null] }, Bson::Null ] };
        // What a newer event sets, and what any event fills in where the state has nothing.
        let mut newer_sets = doc! {
            "status": literal(event.status.as_str()),
            "version": literal(event.version),
            "lastEventId": literal(event.event_id.as_str()),
            "lastEventType": literal(event.event_type.as_str()),
            "updatedAt": "$$NOW",
        };
        let unless_fixed = |value: Bson, field: &str| -> Document {
            doc! { "$cond": [fixed.clone(), format!("${field}"), literal(value)] }
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
        // Whether the event names parameters other than the stored ones.
        let mut names_others = Bson::Boolean(false);
        match &event.token_params {
            Some(Ok(params)) => {
                let owner = params.owner.object_id();
                let token_type = params.token_type.as_str();
                let quantity = i64::from(params.quantity.get());
                names_others = doc! { "$not": [ { "$and": [
                    { "$eq": ["$tokenParams.owner", literal(owner)] },
                    { "$eq": ["$tokenParams.tokenType", literal(token_type)] },
                    { "$eq": ["$tokenParams.quantity", literal(quantity)] },
                ] } ] }
                .into();
                facts.insert(
                    "tokenParams",
                    doc! { "owner": owner, "tokenType": token_type, "quantity": quantity },
                );
                if gate.fixes_params {
                    facts.insert("tokenParamsFixedBy", event.event_id.as_str());
                }
                newer_sets.insert("metadataError", unless_fixed(Bson::Null, "metadataError"));
            }
            // Invalid metadata in a newer event voids older parameters that were not
            // fixed: nobody may issue from metadata the provider has since replaced with
            // something unusable.
            Some(Err(reason)) => {
                names_others = Bson::Boolean(true);
                newer_sets.insert(
                    "metadataError",
                    unless_fixed(reason.as_str().into(), "metadataError"),
                );
                newer_sets.insert("tokenParams", unless_fixed(Bson::Null, "tokenParams"));
            }
            None => {}
        }
        let mut filled = doc! { "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] } };
        for (field, value) in &facts {
            let current = format!("${field}");
            let is_param = field == "tokenParams" || field == "tokenParamsFixedBy";
            newer_sets.insert(
                field.clone(),
                if is_param {
                    unless_fixed(value.clone(), field)
                } else {
                    literal(value.clone())
                },
            );
            // An older event fills a gap only; metadata only if none was ever judged.
            let gap = if is_param {
                doc! { "$and": [
                    { "$eq": [ { "$ifNull": ["$tokenParams", Bson::Null] }, Bson::Null ] },
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
        let moves_from: Vec<&str> = gate.moves_from.iter().map(|s| s.as_str()).collect();
        let held_back = doc! { "$or": [
            { "$and": [
                newer.clone(),
                { "$not": [ { "$in": [
                    { "$ifNull": ["$status", PaymentStatus::Processing.as_str()] },
                    literal(moves_from),
                ] } ] },
            ] },
            { "$and": [ gate.bound_to_fixed_params, fixed.clone(), names_others ] },
        ] };
        // Decided once, on the stored document, before anything of it changes; the mark
        // is removed again at the end, so a held-back event leaves the document as it was.
        let pipeline = vec![
            doc! { "$set": { HELD_BACK: held_back } },
            doc! { "$replaceWith": { "$cond": [
                { "$or": [format!("${HELD_BACK}"), { "$not": [newer] }] },
                "$$ROOT",
                { "$mergeObjects": [ "$$ROOT", newer_sets ] },
            ] } },
            // Runs after the gate: fills what is still missing.
            doc! { "$replaceWith": { "$cond": [
                format!("${HELD_BACK}"),
                "$$ROOT",
                { "$mergeObjects": [ "$$ROOT", filled ] },
            ] } },
            doc! { "$unset": HELD_BACK },
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
