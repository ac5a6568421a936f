//! `idempotency_keys`: one record per (API key id, `Idempotency-Key`), unique on that
//! pair, expired by a TTL index on `expiresAt`. A record without an `answer` is held by
//! the attempt it names until `leaseUntil`; with one, it is the answer every retry gets.
//! Which attempt may hold a key, and what a retry is told, is `issuing`'s to decide.
//!
//! Every time on a record is the database's (`$$NOW`), never an instance's: a lease is
//! written and judged by the one clock every instance shares, so an instance whose clock
//! runs ahead cannot take over a lease that is still running. An action that writes
//! answers its record inside its own transaction (`answer_in_session`), so the action
//! and its answer commit together or not at all.

use std::time::{Duration, Instant};

use mongodb::ClientSession;
use mongodb::bson::{Binary, Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::error::Error;
use mongodb::options::ReturnDocument;
use serde::{Deserialize, Serialize};

use super::Store;
use super::atomic::commit_with_retry;
use super::documents::from_document;
use super::durability::durable_writes;
use super::error::{HELD_PATIENCE, StoreError, duplicate_key_index, ran_out_of_time};
use super::indexes::IDEMPOTENCY_KEY_INDEX;
use super::majority::{Unconfirmed, unconfirmed_find_and_modify};

/// The collection's name.
pub const IDEMPOTENCY_KEYS: &str = "idempotency_keys";

/// One header of a stored answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHeader {
    pub name: String,
    pub value: String,
}

/// The answer a request produced, as its retries replay it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredAnswer {
    pub status: i32,
    pub headers: Vec<StoredHeader>,
    pub body: Binary,
}

/// One document of `idempotency_keys`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdempotencyDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub key_id: String,
    pub key: String,
    pub method: String,
    pub path: String,
    /// Hex SHA-256 of the request body's bytes.
    pub body_sha256: String,
    /// The attempt holding the key (a fresh id per attempt, so a late finish of an
    /// attempt whose lease was taken over writes nothing).
    pub attempt: ObjectId,
    /// Until when the holding attempt may run (by the database's clock); absent once
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<StoredAnswer>,
    pub created_at: DateTime,
    pub expires_at: DateTime,
}

/// A first attempt's claim of a key: what the record binds the key to.
#[derive(Debug, Clone)]
pub struct IdempotencyClaim<'a> {
    pub id: ObjectId,
    pub key_id: &'a str,
    pub key: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// Hex SHA-256 of the request body's bytes.
    pub body_sha256: &'a str,
    pub attempt: ObjectId,
    /// How long the attempt holds the key.
    pub lease: Duration,
    /// How long the record is kept.
    pub retention: Duration,
}

/// A record an attempt holds, by its shard key (API key id and key) and its `_id`: what a
/// release names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRecord {
    pub key_id: String,
    pub key: String,
    pub id: ObjectId,
    pub attempt: ObjectId,
}

/// What a claim found.
#[derive(Debug)]
pub enum Claimed {
    /// The key had no record: this one is the claim's, held by its attempt.
    Fresh,
    /// The key's record, as it is (another attempt's).
    Existing(Box<IdempotencyDoc>),
    /// Another claim of the key inserted its record at the same moment: look again.
    Raced,
    /// A transaction still open holds the record (an attempt committing its answer, or
    /// one whose instance died before its commit), or another attempt's unanswered
    /// record is the primary's and perhaps not yet the majority's: its outcome is not
    /// known yet.
    Held,
}

/// The record an action's transaction answers, and how the answer to the action's result
/// reads. `T` is what the action wrote (a token, a redemption).
pub struct AnswerInTransaction<'a, T: ?Sized> {
    pub record: ObjectId,
    pub attempt: ObjectId,
    pub answer: &'a (dyn Fn(&T) -> StoredAnswer + Send + Sync),
}

impl Store {
    fn idempotency_keys(&self) -> mongodb::Collection<IdempotencyDoc> {
        self.db.collection(IDEMPOTENCY_KEYS)
    }

    /// Inserts the claim's record unless (key id, key) has one, in one command, stamped
    /// with the database's clock; says which happened.
    pub async fn claim_idempotency_record(
        &self,
        claim: &IdempotencyClaim<'_>,
    ) -> Result<Claimed, StoreError> {
        // Client-chosen strings go in as literals: a key that starts with `$` must not
        // read as a field path.
        let fresh = doc! {
            "_id": claim.id,
            "keyId": { "$literal": claim.key_id },
            "key": { "$literal": claim.key },
            "method": { "$literal": claim.method },
            "path": { "$literal": claim.path },
            "bodySha256": { "$literal": claim.body_sha256 },
            "attempt": claim.attempt,
            "leaseUntil": from_now(claim.lease),
            "createdAt": "$$NOW",
            "expiresAt": from_now(claim.retention),
        };
        // An upsert whose pipeline writes the whole record only where there was none
        // (a record always has `attempt`); an existing record is returned untouched.
        let pipeline = vec![doc! {
            "$replaceWith": {
                "$cond": {
                    "if": { "$eq": [{ "$type": "$attempt" }, "missing"] },
                    "then": fresh,
                    "else": "$$ROOT",
                }
            }
        }];
        let since = Instant::now();
        let found = self
            .idempotency_keys()
            .find_one_and_update(doc! { "keyId": claim.key_id, "key": claim.key }, pipeline)
            .upsert(true)
            .return_document(ReturnDocument::After)
            .max_time(HELD_PATIENCE)
            .await;
        match found {
            Ok(Some(record)) if record.attempt == claim.attempt => Ok(Claimed::Fresh),
            Ok(Some(record)) => Ok(Claimed::Existing(Box::new(record))),
            // An upsert always returns the document after it.
            Ok(None) => Ok(Claimed::Raced),
            Err(err) if duplicate_key_index(&err).as_deref() == Some(IDEMPOTENCY_KEY_INDEX) => {
                Ok(Claimed::Raced)
            }
            Err(err) if ran_out_of_time(&err) => Ok(Claimed::Held),
            Err(err) => match unconfirmed_find_and_modify(&err) {
                // This claim's record, or one it left as it was, as the primary has it.
                Some(Unconfirmed::Wrote(written)) => {
                    let record: IdempotencyDoc = from_document(written.clone())?;
                    if record.attempt == claim.attempt {
                        self.await_majority(IDEMPOTENCY_KEYS, &written, since)
                            .await?;
                        return Ok(Claimed::Fresh);
                    }
                    // Another attempt's answer, perhaps one the majority does not have
                    // yet (its commit still waiting for it): replayed only once it does.
                    // An answer never changes, so the majority shows it as it is here.
                    // Not shown in time, it is still settling: the other attempt's
                    // (nothing of this one's to take back).
                    if record.answer.is_some() {
                        return match self.await_majority(IDEMPOTENCY_KEYS, &written, since).await {
                            Ok(()) => Ok(Claimed::Existing(Box::new(record))),
                            Err(StoreError::Unavailable(_)) => Ok(Claimed::Held),
                            Err(other) => Err(other),
                        };
                    }
                    // Another attempt's unanswered record, which its holder may answer or
                    // release meanwhile: nothing to wait for, and nothing to decide on
                    // (a take-over, a key reused) from what the majority may not have.
                    Ok(Claimed::Held)
                }
                // An upsert matches or inserts; a reply that says otherwise: look again.
                Some(Unconfirmed::Nothing) => Ok(Claimed::Raced),
                None => Err(err.into()),
            },
        }
    }

    /// Hands the unanswered record `existing` to `claim`'s attempt for its lease, bound
    /// to `claim`'s method, path and body and kept `claim`'s retention from now (the
    /// answer this attempt stores is kept as long as a fresh claim's), if its lease is
    /// over by the database's clock; `false` when it is still running, the record was
    /// answered or taken over meanwhile, or a transaction still open holds it.
    pub async fn take_over_idempotency_record(
        &self,
        existing: &IdempotencyDoc,
        claim: &IdempotencyClaim<'_>,
    ) -> Result<bool, StoreError> {
        let since = Instant::now();
        let taken = self
            .idempotency_keys()
            .find_one_and_update(
                // The shard key too: a sharded findAndModify must name it.
                doc! {
                    "_id": existing.id,
                    "keyId": &existing.key_id,
                    "key": &existing.key,
                    "answer": { "$exists": false },
                    "$expr": { "$lt": ["$leaseUntil", "$$NOW"] },
                },
                vec![doc! { "$set": {
                    "attempt": claim.attempt,
                    "leaseUntil": from_now(claim.lease),
                    "method": { "$literal": claim.method },
                    "path": { "$literal": claim.path },
                    "bodySha256": { "$literal": claim.body_sha256 },
                    "expiresAt": from_now(claim.retention),
                } }],
            )
            .return_document(ReturnDocument::After)
            .max_time(HELD_PATIENCE)
            .await;
        match taken {
            Ok(taken) => Ok(taken.is_some()),
            Err(err) if ran_out_of_time(&err) => Ok(false),
            Err(err) => match unconfirmed_find_and_modify(&err) {
                Some(Unconfirmed::Wrote(written)) => {
                    self.await_majority(IDEMPOTENCY_KEYS, &written, since)
                        .await?;
                    Ok(true)
                }
                Some(Unconfirmed::Nothing) => Ok(false),
                None => Err(err.into()),
            },
        }
    }

    /// Stores `answer` on record `id` if `attempt` still holds it; `false` otherwise.
    pub async fn store_idempotent_answer(
        &self,
        id: ObjectId,
        attempt: ObjectId,
        answer: &StoredAnswer,
    ) -> Result<bool, StoreError> {
        let result = self
            .idempotency_keys()
            .update_one(
                held_by(id, attempt),
                answered(answer).map_err(StoreError::Internal)?,
            )
            .await?;
        Ok(result.modified_count == 1)
    }

    /// [`Store::store_idempotent_answer`] inside `session`'s transaction, so that the
    /// answer commits with the action that writes it; `false` when `attempt` no longer
    /// holds the record (the transaction must then be aborted).
    pub(super) async fn answer_in_session(
        &self,
        session: &mut ClientSession,
        id: ObjectId,
        attempt: ObjectId,
        answer: &StoredAnswer,
    ) -> Result<bool, Error> {
        let update = answered(answer).map_err(Error::custom)?;
        let result = self
            .idempotency_keys()
            .update_one(held_by(id, attempt), update)
            .session(session)
            .await?;
        Ok(result.modified_count == 1)
    }

    /// Answers `answered`'s record with the answer to `written` inside `session`'s
    /// transaction, then commits it, so the action and its answer stand or fall
    /// together; with no record to answer, only commits. `false`, nothing committed, when
    /// another attempt has taken the record over (the transaction must then be aborted).
    pub(super) async fn answer_and_commit<T: ?Sized>(
        &self,
        session: &mut ClientSession,
        answered: Option<&AnswerInTransaction<'_, T>>,
        written: &T,
    ) -> Result<bool, Error> {
        if let Some(answered) = answered {
            let answer = (answered.answer)(written);
            if !self
                .answer_in_session(session, answered.record, answered.attempt, &answer)
                .await?
            {
                return Ok(false);
            }
        }
        commit_with_retry(session).await?;
        Ok(true)
    }

    /// Deletes the unanswered record `held` names if its attempt still holds it, waiting
    /// at most `HELD_PATIENCE` for a transaction that holds the record (one that took the
    /// key over and has not ended) and as long for the majority (or the URI's
    /// `wtimeoutMS`, if shorter): a release that cannot be confirmed leaves the record to
    /// its lease rather than holding its request and a connection. A `findAndModify`
    /// (which must name the shard key), because the driver's `delete` takes no
    /// `maxTimeMS`.
    pub async fn release_idempotency_record(&self, held: &HeldRecord) -> Result<(), StoreError> {
        let wtimeout = self
            .db
            .write_concern()
            .and_then(|concern| concern.w_timeout)
            .map_or(HELD_PATIENCE, |uri| uri.min(HELD_PATIENCE));
        let mut filter = held_by(held.id, held.attempt);
        filter.insert("keyId", held.key_id.as_str());
        filter.insert("key", held.key.as_str());
        match self
            .idempotency_keys()
            .find_one_and_delete(filter)
            .max_time(HELD_PATIENCE)
            .write_concern(durable_writes(Some(wtimeout)))
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if ran_out_of_time(&err) => Err(StoreError::unavailable(
                "an idempotency record held by a transaction could not be released; its lease will end it",
            )),
            Err(err) => Err(err.into()),
        }
    }
}

/// The record `id`, unanswered and held by `attempt`.
fn held_by(id: ObjectId, attempt: ObjectId) -> Document {
    doc! { "_id": id, "attempt": attempt, "answer": { "$exists": false } }
}

/// The update that keeps `answer` and ends the lease.
fn answered(answer: &StoredAnswer) -> Result<Document, String> {
    let answer =
        mongodb::bson::to_bson(answer).map_err(|e| format!("cannot encode answer: {e}"))?;
    Ok(doc! { "$set": { "answer": answer }, "$unset": { "leaseUntil": "" } })
}

/// The database's clock `by` from now, as an aggregation expression.
fn from_now(by: Duration) -> Document {
    let millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    doc! { "$add": ["$$NOW", Bson::Int64(millis)] }
}
