//! Issuance records and a payment's token set, as persisted. Nothing here decides whether
//! a payment may be issued or which parameters win: `issuing` does, and calls these.
//!
//! The record's unique index on the payment key is the arbiter: `claim_record` inserts
//! it unless the payment has one, and hands back the one that exists.

use futures::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;

use super::documents::{IssuanceDoc, TokenSummary, from_document, token_summary_projection};
use super::error::{ISSUANCES_PAYMENT_INDEX, StoreError, refuses_the_document};
use super::filters::{issuance_filter, payment_tokens_filter};
use super::placeholder::{Existing, records_only};
use super::{ISSUANCES, Store, TOKENS};
use crate::domain::{IssuanceStatus, PaymentKey};

/// What one try to lease an unfinished record came to (`Store::lease_unfinished_record`).
#[derive(Debug)]
pub enum LeaseAttempt {
    /// Leased to this repairer until the lease runs out.
    Leased(IssuanceDoc),
    /// Leased, but the stored document is not a readable record (a field of another
    /// type, written by hand or by another tool). It stays leased until the lease runs
    /// out.
    Unreadable {
        /// The record's `_id`, for the sweep to pass over.
        id: Bson,
        error: StoreError,
    },
    /// The database refused the lease's write for this record alone, for what the
    /// record would become (a validator, say): nothing was written, so the record is
    /// still leasable. An error every lease would meet is the call's `Err` instead.
    Refused {
        /// The record's `_id`, for the sweep to pass over.
        id: Bson,
        error: StoreError,
    },
}

impl Store {
    /// Inserts `record` unless its payment's place is taken; returns what takes it if so
    /// (`None`: this call inserted it).
    pub async fn claim_record(&self, record: &IssuanceDoc) -> Result<Option<Existing>, StoreError> {
        let filter = doc! {
            "provider": &record.provider,
            "accountId": &record.account_id,
            "paymentIntentId": &record.payment_intent_id,
        };
        let update = doc! { "$setOnInsert": record_document(record)? };
        let existing = self
            .upsert_one(
                ISSUANCES,
                ISSUANCES_PAYMENT_INDEX,
                filter,
                update,
                ReturnDocument::Before,
            )
            .await?;
        existing.map(Existing::from_stored).transpose()
    }

    /// The issuance record of a payment, if it has one (a placeholder is none).
    pub async fn find_record(&self, key: &PaymentKey) -> Result<Option<IssuanceDoc>, StoreError> {
        let mut filter = issuance_filter(key);
        filter.extend(records_only());
        Ok(self.records().find_one(filter).await?)
    }

    /// Whatever takes the payment's place in `issuances`: its record, or a placeholder.
    pub(super) async fn find_existing(
        &self,
        key: &PaymentKey,
    ) -> Result<Option<Existing>, StoreError> {
        let found = self
            .collection(ISSUANCES)
            .find_one(issuance_filter(key))
            .await?;
        found.map(Existing::from_stored).transpose()
    }

    /// Turns a `pending` record into `record`, an `issuing` record of the request that
    /// authorises the payment (a trusted backend's issuance or the provider's success),
    /// keeping only the pending record's `_id`. Every other field is the authorising
    /// request's: the pending one came from an anonymous checkout, so its owner, token
    /// type, quantity, `paymentDate`, `requestedBy` and `createdAt` must not survive (the
    /// tokens take their `origin.date` from `paymentDate`; self-repair, which takes
    /// `issuing` records by `createdAt`, must see the take-over as new). Returns the
    /// record as it now is, or `None` when it was no longer pending (someone else took it
    /// over, or it expired).
    pub async fn take_over_pending(
        &self,
        id: ObjectId,
        record: &IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        let mut taken = record.with_id(id);
        taken.status = IssuanceStatus::Issuing;
        taken.expires_at = None;
        Ok(self
            .records()
            .find_one_and_replace(
                // The payment key is the shard key of a sharded `issuances`, which a
                // `findAndModify` there must name; the record taken over is this
                // payment's, so it narrows nothing.
                doc! {
                    "_id": id,
                    "provider": &record.provider,
                    "accountId": &record.account_id,
                    "paymentIntentId": &record.payment_intent_id,
                    "status": IssuanceStatus::Pending.as_str(),
                },
                &taken,
            )
            .return_document(ReturnDocument::After)
            .await?)
    }

    /// Confirms an `unconfirmed` record (see `IssuanceDoc::unconfirmed`) for a writer
    /// about to act on it: from now on the batch that inserted it can no longer take it
    /// back. Returns the record as it now is (confirmed by this write, or before by its
    /// batch's mark or another writer), or `None` when it is gone: taken back by its
    /// batch (the payment does not stand), or rolled back by a failover.
    ///
    /// A write even when the flag is gone already, so that its majority also covers a
    /// confirm someone else made (a read could return one a failover may still undo);
    /// and only of this very record: a record taken back into a placeholder keeps its
    /// `_id`, which a later record or pending request taking the placeholder over
    /// keeps too.
    pub async fn confirm_record(
        &self,
        record: &IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        Ok(self
            .records()
            .find_one_and_update(
                this_record(record),
                doc! { "$unset": { "unconfirmed": "" } },
            )
            .return_document(ReturnDocument::After)
            .await?)
    }

    /// `record` as it now is, `None` when it is gone (as `confirm_record` tells), read.
    pub async fn reread_record(
        &self,
        record: &IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        Ok(self.records().find_one(this_record(record)).await?)
    }

    /// Marks an `issuing` record `issued`: its set is complete and checked against the
    /// payment. Idempotent: true when the record is `issued` now, by this write or an
    /// earlier one; false when there is no such record (a failover rolled its insert
    /// back). Majority like every write (`durability`): the next read of the record, at
    /// majority, must see the mark.
    pub async fn mark_issued(&self, id: ObjectId) -> Result<bool, StoreError> {
        let marked = [IssuanceStatus::Issuing, IssuanceStatus::Issued].map(|s| s.as_str());
        let result = self
            .collection(ISSUANCES)
            .update_one(
                doc! { "_id": id, "status": { "$in": marked.to_vec() } },
                doc! {
                    "$set": { "status": IssuanceStatus::Issued.as_str() },
                    "$unset": { "repairLeaseUntil": "", "unconfirmed": "" },
                },
            )
            .await?;
        Ok(result.matched_count == 1)
    }

    /// Leases one `issuing` record created before `created_before` whose lease (if any)
    /// has run out, for `lease` from now. Instances repairing at once each get another
    /// record; a repairer that dies lets its lease run out and the record is taken again.
    ///
    /// In two steps, because a `findAndModify` on a sharded `issuances` must name the
    /// shard key (the payment key): a scatter `find` of the oldest few candidates, then a
    /// targeted `findOneAndUpdate` per candidate that repeats every condition, so two
    /// repairers that found the same candidate still cannot both lease it.
    ///
    /// Records whose `_id` is in `passing_over` are not candidates: the sweep names there
    /// the ones it tried and left `issuing` (refused, unreadable, failed), which are, or
    /// once their lease runs out become, leasable again and would otherwise come first
    /// again, being the oldest. `None`: no record is leasable.
    pub async fn lease_unfinished_record(
        &self,
        created_before: DateTime,
        lease: std::time::Duration,
        passing_over: &[Bson],
    ) -> Result<Option<LeaseAttempt>, StoreError> {
        /// Candidates per attempt: enough that repairers racing for the oldest record
        /// each find another, few enough to read nothing much.
        const CANDIDATES: i64 = 8;
        let now = DateTime::now();
        let until = DateTime::from_millis(now.timestamp_millis() + lease.as_millis() as i64);
        let leasable = doc! {
            "status": IssuanceStatus::Issuing.as_str(),
            "createdAt": { "$lt": created_before },
            "_id": { "$nin": passing_over },
            "$or": [
                { "repairLeaseUntil": { "$exists": false } },
                { "repairLeaseUntil": { "$lt": now } },
            ],
        };
        let candidates: Vec<Document> = self
            .collection(ISSUANCES)
            .find(leasable.clone())
            .projection(doc! { "provider": 1, "accountId": 1, "paymentIntentId": 1 })
            .sort(doc! { "createdAt": 1 })
            .limit(CANDIDATES)
            .await?
            .try_collect()
            .await?;
        for candidate in candidates {
            let mut targeted = leasable.clone();
            for field in ["_id", "provider", "accountId", "paymentIntentId"] {
                if let Some(value) = candidate.get(field) {
                    targeted.insert(field, value.clone());
                }
            }
            let leased = self
                .collection(ISSUANCES)
                .find_one_and_update(targeted, doc! { "$set": { "repairLeaseUntil": until } })
                .return_document(ReturnDocument::After)
                .await;
            match leased {
                Ok(Some(leased)) => {
                    let id = leased.get("_id").cloned().unwrap_or(Bson::Null);
                    return Ok(Some(match from_document(leased) {
                        Ok(record) => LeaseAttempt::Leased(record),
                        Err(error) => LeaseAttempt::Unreadable { id, error },
                    }));
                }
                Ok(None) => {}
                // This record alone: the others may still be leased.
                Err(err) if refuses_the_document(&err) => {
                    let id = candidate.get("_id").cloned().unwrap_or(Bson::Null);
                    let error = StoreError::from(err);
                    return Ok(Some(LeaseAttempt::Refused { id, error }));
                }
                // Anything every lease would meet (an outage, rights, disk) ends the
                // sweep, as one failure rather than one per record.
                Err(err) => return Err(err.into()),
            }
        }
        Ok(None)
    }

    /// The payment's tokens in tokenIndex order (served by the unique index's prefix).
    pub async fn payment_tokens(&self, key: &PaymentKey) -> Result<Vec<TokenSummary>, StoreError> {
        // A majority read, as every read (`durability`): a replay must not acknowledge
        // tokens a concurrent request wrote but that are not yet replicated (a failover
        // could still roll them back). Fewer visible tokens send the replay through the
        // completing bulk, whose `w: majority` makes them durable before the answer.
        let cursor = self
            .db
            .collection::<TokenSummary>(TOKENS)
            .find(payment_tokens_filter(key))
            .projection(token_summary_projection())
            .sort(doc! { "tokenIndex": 1 })
            .await?;
        Ok(cursor.try_collect().await?)
    }

    /// The payment's tokens in tokenIndex order, as `payment_tokens` reads them, each
    /// with whose it is (`TokenHolder`): in the same read, so that telling whether they
    /// are a record's set costs no round trip.
    pub async fn payment_tokens_held(
        &self,
        key: &PaymentKey,
    ) -> Result<Vec<(TokenSummary, TokenHolder)>, StoreError> {
        let mut projection = token_summary_projection();
        projection.extend(doc! { "owner": 1, "type": 1, "transferredAt": 1 });
        let cursor = self
            .db
            .collection::<Document>(TOKENS)
            .find(payment_tokens_filter(key))
            .projection(projection)
            .sort(doc! { "tokenIndex": 1 })
            .await?;
        let rows: Vec<Document> = cursor.try_collect().await?;
        rows.into_iter()
            .map(|row| {
                let holder = TokenHolder {
                    owner: row.get_object_id("owner").ok(),
                    token_type: row.get_str("type").unwrap_or_default().to_owned(),
                    transferred: row.contains_key("transferredAt"),
                };
                Ok((from_document(row)?, holder))
            })
            .collect()
    }
}

/// Whose a token is, as stored: its owner, its type, and whether a transfer gave it that
/// owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    pub owner: Option<ObjectId>,
    pub token_type: String,
    pub transferred: bool,
}

/// The issuance record as a document to insert.
pub(super) fn record_document(record: &IssuanceDoc) -> Result<Document, StoreError> {
    mongodb::bson::to_document(record)
        .map_err(|e| StoreError::Internal(format!("cannot encode issuance record: {e}")))
}

/// The filter that finds `record` itself, past its batch's take-back: the same `_id`,
/// payment key (the shard key of a sharded `issuances`, which a `findAndModify` there
/// must name), creation time and parameters, and still a record past `pending`. A
/// record or pending request that took its `_id` over has its own creation time.
fn this_record(record: &IssuanceDoc) -> Document {
    let statuses = [IssuanceStatus::Issuing, IssuanceStatus::Issued].map(|s| s.as_str());
    doc! {
        "_id": record.id,
        "provider": &record.provider,
        "accountId": &record.account_id,
        "paymentIntentId": &record.payment_intent_id,
        "createdAt": record.created_at,
        "owner": record.owner,
        "tokenType": &record.token_type,
        "quantity": record.quantity,
        "status": { "$in": statuses.to_vec() },
    }
}
