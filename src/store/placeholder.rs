//! Placeholders: what a refund leaves in `issuances` for a payment that has no record.
//!
//! Why a refund writes here at all: an atomic issuance reads the payment, then commits
//! its record and tokens in one transaction. A refund recorded between that read and the
//! commit cannot see the uncommitted tokens, and the transaction does not see the refund:
//! reads inside a transaction never conflict, only writes to the same document (or the
//! same unique-index key) do. So a refund, after recording the payment's new state and
//! before revoking, holds the payment's place in the issuance index (`hold_place`):
//! - if a transaction has inserted the payment's record but not committed, the hold
//!   waits for the commit, finds the record, and the refund's revoke that follows sees
//!   the tokens;
//! - otherwise the hold writes a placeholder, and any transaction that has not yet
//!   inserted its record runs into it (a duplicate key, or a write conflict for one whose
//!   snapshot is older) and commits nothing; its request takes the one-request path,
//!   which reads the payment again after writing.
//!
//! Either way the refund and the issuance are ordered without the issuance reading the
//! payment a second time. A hold that finds an `issuing` record (upsert mode: its tokens
//! may still be on their way) marks it `heldAt`, and the writer's conditional mark leaves
//! a held record `issuing`, to be settled against the payment read again. A placeholder is not a record: every read of records skips it,
//! and whoever claims the payment later (a checkout's pending request, an issuance of a
//! partly refunded payment) takes it over in place, keeping its `_id`, so that the index
//! key is never free in between. Placeholders expire after `PLACEHOLDER_LIFETIME` (the
//! TTL index on `expiresAt`, as pending records do); each new hold extends it. A hold
//! that finds a pending record keeps it at least that long too: a batch that read the
//! payment before the refund may still be retrying its transaction, and a pending record
//! expiring in between would free the place under it.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;

use super::documents::{IssuanceDoc, RECORD_KEY_FIELDS, from_document};
use super::error::{ISSUANCES_PAYMENT_INDEX, StoreError};
use super::filters::{issuance_filter, issuances_filter};
use super::{ISSUANCES, Store};
use crate::domain::{IssuanceStatus, PaymentKey};

/// The `status` of a placeholder. Not an `IssuanceStatus`: it never leaves this layer.
pub(super) const PLACEHOLDER: &str = "placeholder";

/// How long a placeholder lives after the last hold (and at least how long a hold keeps
/// a pending record). An issuance that trusts a payment read for less than this (by a
/// wide margin: the TTL monitor is late, never early) cannot outlive what stops it.
pub const PLACEHOLDER_LIFETIME: Duration = Duration::from_secs(3600);

/// What occupies a payment's place in `issuances`.
#[derive(Debug)]
pub enum Existing {
    /// A record (pending, issuing or issued).
    Record(IssuanceDoc),
    /// A refund's placeholder, by `_id`: to be taken over, not answered from.
    Placeholder(ObjectId),
}

impl Existing {
    /// Decodes whatever `issuances` holds for a payment.
    pub(super) fn from_stored(document: Document) -> Result<Self, StoreError> {
        if document.get_str("status") == Ok(PLACEHOLDER) {
            let id = document
                .get_object_id("_id")
                .map_err(|_| StoreError::Internal("placeholder without an _id".to_owned()))?;
            return Ok(Self::Placeholder(id));
        }
        from_document(document).map(Self::Record)
    }
}

/// The clause that keeps placeholders out of a read of records.
pub(super) fn records_only() -> Document {
    doc! { "status": { "$ne": PLACEHOLDER } }
}

/// The update pipeline that turns a record into a placeholder in place, as a hold would
/// have left it: the same `_id` and payment key, a fresh lifetime, the rest dropped.
pub(super) fn from_record() -> Vec<Document> {
    let lifetime_ms = PLACEHOLDER_LIFETIME.as_millis() as i64;
    let mut placeholder: Document = RECORD_KEY_FIELDS
        .into_iter()
        .map(|field| (field.to_owned(), Bson::String(format!("${field}"))))
        .collect();
    placeholder.extend(doc! {
        "_id": "$_id",
        "status": PLACEHOLDER,
        "heldAt": "$heldAt",
        "createdAt": "$createdAt",
        "expiresAt": { "$add": ["$$NOW", lifetime_ms] },
    });
    vec![doc! { "$replaceWith": placeholder }]
}

impl Store {
    /// A refund's hold on the payment's place (see the module's comment): waits for an
    /// uncommitted record of the payment, or writes (or extends) a placeholder. Returns
    /// the payment's record, if it has one.
    pub async fn hold_place(&self, key: &PaymentKey) -> Result<Option<IssuanceDoc>, StoreError> {
        let lifetime_ms = PLACEHOLDER_LIFETIME.as_millis() as i64;
        // A record is left as it is, but for its expiry: whatever holds the place must
        // stay at least as long as a placeholder would, so one that would expire sooner
        // (a pending record, a placeholder) is kept until then, and one that never
        // expires stays so. (`$max` skips a missing field.) The server's clock sets the
        // expiry, as it is the one the TTL monitor reads.
        let never_expires = doc! { "$and": [
            { "$ne": [{ "$ifNull": ["$status", PLACEHOLDER] }, PLACEHOLDER] },
            { "$eq": [{ "$type": "$expiresAt" }, "missing"] },
        ] };
        // An `issuing` record is marked held: its writer may have read the payment
        // before this refund, and its conditional mark (`mark_settled`) then leaves it
        // `issuing` for a settle that reads the payment again.
        let issuing = doc! { "$eq": ["$status", IssuanceStatus::Issuing.as_str()] };
        let pipeline = vec![doc! { "$set": {
            "heldAt": { "$cond": [issuing, "$$NOW", "$heldAt"] },
            "status": { "$ifNull": ["$status", PLACEHOLDER] },
            "expiresAt": { "$cond": [
                never_expires,
                "$$REMOVE",
                { "$max": ["$expiresAt", { "$add": ["$$NOW", lifetime_ms] }] },
            ] },
            "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] },
        } }];
        let before = self
            .upsert_one(
                ISSUANCES,
                ISSUANCES_PAYMENT_INDEX,
                issuance_filter(key),
                pipeline,
                ReturnDocument::Before,
            )
            .await?;
        match before.map(Existing::from_stored).transpose()? {
            Some(Existing::Record(record)) => Ok(Some(record)),
            Some(Existing::Placeholder(_)) | None => Ok(None),
        }
    }

    /// Replaces the placeholder `id` by `record`, in place: the record takes the
    /// placeholder's `_id`, so the payment's index key is never free. Returns the record
    /// as stored, or `None` when the placeholder is gone (expired, or taken over).
    pub async fn take_over_placeholder(
        &self,
        id: ObjectId,
        record: &IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        let taken = record.with_id(id);
        let replaced = self
            .records()
            .replace_one(doc! { "_id": id, "status": PLACEHOLDER }, &taken)
            .await?;
        Ok((replaced.matched_count == 1).then_some(taken))
    }

    /// The payments of `keys` whose place in `issuances` is taken, by a record or a
    /// placeholder.
    pub async fn taken_places(
        &self,
        keys: &[&PaymentKey],
    ) -> Result<HashSet<PaymentKey>, StoreError> {
        if keys.is_empty() {
            return Ok(HashSet::new());
        }
        let projection: Document = RECORD_KEY_FIELDS
            .into_iter()
            .map(|field| (field.to_owned(), Bson::Int32(1)))
            .collect();
        let rows: Vec<Document> = self
            .collection(ISSUANCES)
            .find(issuances_filter(keys))
            .projection(projection)
            .await?
            .try_collect()
            .await?;
        rows.iter()
            .map(|row| {
                let field = |name: &str| row.get_str(name).unwrap_or_default();
                super::documents::stored_key(
                    field("provider"),
                    field("accountId"),
                    field("paymentIntentId"),
                )
            })
            .collect()
    }
}
