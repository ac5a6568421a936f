//! `idempotency_keys`: one record per (API key id, `Idempotency-Key`), unique on that
//! pair, expired by a TTL index on `expiresAt`. A record without an `answer` is held by
//! the attempt it names until `leaseUntil`; with one, it is the answer every retry gets.
//! Which attempt may hold a key, and what a retry is told, is `issuing`'s to decide.

use mongodb::bson::{Binary, DateTime, doc, oid::ObjectId};
use serde::{Deserialize, Serialize};

use super::Store;
use super::error::{StoreError, duplicate_key_index};
use super::indexes::IDEMPOTENCY_KEY_INDEX;

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
    /// Until when the holding attempt may run; absent once answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<StoredAnswer>,
    pub created_at: DateTime,
    pub expires_at: DateTime,
}

impl Store {
    fn idempotency_keys(&self) -> mongodb::Collection<IdempotencyDoc> {
        self.db.collection(IDEMPOTENCY_KEYS)
    }

    /// Inserts `record`; `false` when (key id, key) has a record already.
    pub async fn insert_idempotency_record(
        &self,
        record: &IdempotencyDoc,
    ) -> Result<bool, StoreError> {
        match self.idempotency_keys().insert_one(record).await {
            Ok(_) => Ok(true),
            Err(err) if duplicate_key_index(&err).as_deref() == Some(IDEMPOTENCY_KEY_INDEX) => {
                Ok(false)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// The record of (key id, key), if there is one.
    pub async fn find_idempotency_record(
        &self,
        key_id: &str,
        key: &str,
    ) -> Result<Option<IdempotencyDoc>, StoreError> {
        Ok(self
            .idempotency_keys()
            .find_one(doc! { "keyId": key_id, "key": key })
            .await?)
    }

    /// Hands the unanswered record `id` to `attempt` until `lease_until`, if its lease
    /// ended before `now`; `false` when it was answered or taken over meanwhile.
    pub async fn take_over_idempotency_record(
        &self,
        id: ObjectId,
        now: DateTime,
        attempt: ObjectId,
        lease_until: DateTime,
    ) -> Result<bool, StoreError> {
        let result = self
            .idempotency_keys()
            .update_one(
                doc! {
                    "_id": id,
                    "answer": { "$exists": false },
                    "leaseUntil": { "$lt": now },
                },
                doc! { "$set": { "attempt": attempt, "leaseUntil": lease_until } },
            )
            .await?;
        Ok(result.modified_count == 1)
    }

    /// Stores `answer` on record `id` if `attempt` still holds it; `false` otherwise.
    pub async fn store_idempotent_answer(
        &self,
        id: ObjectId,
        attempt: ObjectId,
        answer: &StoredAnswer,
    ) -> Result<bool, StoreError> {
        let answer = mongodb::bson::to_bson(answer)
            .map_err(|e| StoreError::Internal(format!("cannot encode answer: {e}")))?;
        let result = self
            .idempotency_keys()
            .update_one(
                doc! { "_id": id, "attempt": attempt, "answer": { "$exists": false } },
                doc! { "$set": { "answer": answer }, "$unset": { "leaseUntil": "" } },
            )
            .await?;
        Ok(result.modified_count == 1)
    }

    /// Deletes the unanswered record `id` if `attempt` still holds it.
    pub async fn release_idempotency_record(
        &self,
        id: ObjectId,
        attempt: ObjectId,
    ) -> Result<(), StoreError> {
        self.idempotency_keys()
            .delete_one(doc! { "_id": id, "attempt": attempt, "answer": { "$exists": false } })
            .await?;
        Ok(())
    }
}
