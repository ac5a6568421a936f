//! Retry-safe actions through an `Idempotency-Key` (the pattern issuance is built on: a
//! unique key bound to the request's content, the database as the arbiter). The first
//! attempt of a key inserts its record into `idempotency_keys`, whose unique index on
//! (API key id, key) lets exactly one attempt in, on whichever instance; it runs the
//! action and stores the answer there. Every later request with that key is told, from the record alone:
//!
//! - another method, path or body → `Reused` (the key names another request);
//! - an answer stored → `Replay` of it, status and body as the first attempt had them;
//! - no answer yet and the holder's lease running → `InProgress`;
//! - no answer and the lease over (the holder's instance died, or its request was
//!   dropped or timed out) → this attempt takes the key over and runs the action.
//!
//! A 5xx says nothing of what happened, so it is not kept: the key is released and a
//! retry runs the action again. Nor is a refusal of the request itself (a bad body, a
//! missing `If-Match`, the key's scope, the rate limit): the action never ran, and the
//! corrected request may use the same key. That re-run (like the one after a take-over) is answered
//! as the first attempt only where the action itself recognises its own effect (a redeem
//! with its `reference` replays); a transfer or a revoke with an exact `If-Match` answers
//! 412 instead, and a transfer with `If-Match: *` is applied again.

use mongodb::bson::{Binary, DateTime, oid::ObjectId, spec::BinarySubtype};
use sha2::{Digest, Sha256};

use super::Issuer;
use crate::domain::IdempotencyKey;
use crate::store::{IdempotencyDoc, StoreError, StoredAnswer, StoredHeader};

/// Answers that refuse the request before its action could run (400 malformed, 403
/// scope, 413 too large, 415 not JSON, 422 invalid, 428 no `If-Match`, 429 rate
/// limited). They are not kept: nothing happened, so the corrected request may reuse the
/// key (payment APIs save no result for a request that failed validation either). The
/// action's own refusals (404, 409, 412) are kept: they are what happened to it.
const REFUSED_BEFORE_THE_ACTION: [u16; 7] = [400, 403, 413, 415, 422, 428, 429];

/// Whether an answer of `status` is kept for the key's retries.
fn is_kept(status: u16) -> bool {
    status < 500 && !REFUSED_BEFORE_THE_ACTION.contains(&status)
}

/// How often one request looks again when the record it collided with vanished before it
/// could be read (expired, or released by an attempt that failed with a 5xx).
const CLAIM_ATTEMPTS: u32 = 3;

/// What an idempotent request is bound to, besides its key.
#[derive(Debug, Clone)]
pub struct IdempotentRequest<'a> {
    /// The API key id: keys are scoped per API key, so two clients never collide.
    pub key_id: &'a str,
    pub key: &'a IdempotencyKey,
    pub method: &'a str,
    pub path: &'a str,
    pub body: &'a [u8],
}

/// An answer as the HTTP layer produced it, and as its retries replay it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The key, held by this attempt until it finishes.
#[derive(Debug)]
pub struct Attempt {
    record: ObjectId,
    attempt: ObjectId,
}

/// What a request with an `Idempotency-Key` is to do.
#[derive(Debug)]
pub enum Begun {
    /// The key is this attempt's: run the action, then [`Issuer::finish_idempotent`].
    Proceed(Attempt),
    /// The key's first request was answered so: answer the same.
    Replay(Answer),
    /// The key was used for another method, path or body.
    Reused,
    /// The key's first request is still running.
    InProgress,
}

impl Issuer {
    /// Claims `request`'s key for this attempt, or says how the key's earlier request
    /// decides this one's answer.
    pub async fn begin_idempotent(
        &self,
        request: &IdempotentRequest<'_>,
    ) -> Result<Begun, StoreError> {
        let config = &self.config.idempotency;
        let body_sha256 = hex::encode(Sha256::digest(request.body));
        for _ in 0..CLAIM_ATTEMPTS {
            let now = DateTime::now();
            let attempt = ObjectId::new();
            let lease_until = later(now, config.lease);
            let record = IdempotencyDoc {
                id: ObjectId::new(),
                key_id: request.key_id.to_owned(),
                key: request.key.as_str().to_owned(),
                method: request.method.to_owned(),
                path: request.path.to_owned(),
                body_sha256: body_sha256.clone(),
                attempt,
                lease_until: Some(lease_until),
                answer: None,
                created_at: now,
                expires_at: later(now, config.retention),
            };
            if self.store.insert_idempotency_record(&record).await? {
                return Ok(Begun::Proceed(Attempt {
                    record: record.id,
                    attempt,
                }));
            }
            let Some(existing) = self
                .store
                .find_idempotency_record(request.key_id, request.key.as_str())
                .await?
            else {
                continue;
            };
            if existing.method != request.method
                || existing.path != request.path
                || existing.body_sha256 != body_sha256
            {
                return Ok(Begun::Reused);
            }
            if let Some(answer) = existing.answer {
                return Ok(Begun::Replay(answer.into()));
            }
            if existing.lease_until.is_some_and(|until| until > now) {
                return Ok(Begun::InProgress);
            }
            // The holder ended without an answer: its request was dropped, timed out, or
            // its instance died. Whoever takes the lease over runs the action.
            if self
                .store
                .take_over_idempotency_record(existing.id, now, attempt, lease_until)
                .await?
            {
                return Ok(Begun::Proceed(Attempt {
                    record: existing.id,
                    attempt,
                }));
            }
        }
        // Another attempt kept winning the key meanwhile: it is running.
        Ok(Begun::InProgress)
    }

    /// Keeps `answer` for the key's retries, or releases the key when the answer is a 5xx
    /// (nothing is known of what happened, so a retry must run the action again) or a
    /// refusal of the request itself (`REFUSED_BEFORE_THE_ACTION`).
    pub async fn finish_idempotent(
        &self,
        attempt: Attempt,
        answer: &Answer,
    ) -> Result<(), StoreError> {
        if !is_kept(answer.status) {
            return self
                .store
                .release_idempotency_record(attempt.record, attempt.attempt)
                .await;
        }
        let stored = StoredAnswer::from(answer);
        if !self
            .store
            .store_idempotent_answer(attempt.record, attempt.attempt, &stored)
            .await?
        {
            // Held past its lease and taken over: the attempt that took over answers.
            tracing::warn!("an idempotency key's lease ended before its answer was stored");
        }
        Ok(())
    }
}

fn later(now: DateTime, by: std::time::Duration) -> DateTime {
    let millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
}

impl From<&Answer> for StoredAnswer {
    fn from(answer: &Answer) -> Self {
        Self {
            status: i32::from(answer.status),
            headers: answer
                .headers
                .iter()
                .map(|(name, value)| StoredHeader {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            body: Binary {
                subtype: BinarySubtype::Generic,
                bytes: answer.body.clone(),
            },
        }
    }
}

impl From<StoredAnswer> for Answer {
    fn from(stored: StoredAnswer) -> Self {
        Self {
            status: u16::try_from(stored.status).unwrap_or(500),
            headers: stored
                .headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
            body: stored.body.bytes,
        }
    }
}
