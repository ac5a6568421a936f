//! Retry-safe actions through an `Idempotency-Key` (the pattern issuance is built on: a
//! unique key bound to the request's content, the database as the arbiter). The first
//! attempt of a key claims its record in `idempotency_keys` (one upsert that writes it
//! only where there is none), whose unique index on (API key id, key) lets exactly one
//! attempt in, on whichever instance; it runs the action and stores the answer there.
//! Every later request with that key is told, from the record alone:
//!
//! - another method, path or body → `Reused` (the key names another request), unless
//!   the record has no answer and its lease is over on a deployment with transactions:
//!   nothing of that request took effect (its answer was not kept and its release was
//!   lost, or storing an answer that writes nothing failed), so this one takes the key
//!   over, as it could a released key, and the record is kept the retention from then;
//! - an answer stored → `Replay` of it, status and body as the first attempt had them;
//! - no answer yet and the holder's lease running, by the database's clock, or the record
//!   held by a transaction still open → `InProgress`;
//! - no answer and the lease over (the holder's instance died, or its request was
//!   dropped or timed out) → this attempt takes the key over and runs the action.
//!
//! An action that writes commits its answer with its write, in one transaction
//! (`Keyed`): the token's change or the redemption, and the record's answer, are both
//! there or neither is. So an attempt whose answer was lost never leaves an effect
//! behind without it: its instance died before the commit (nothing happened, the retry
//! runs the action for the first time), or the commit carried the answer (the retry
//! replays it). An attempt whose lease was taken over finds the record held by another
//! attempt inside its transaction and aborts: its write never commits. Answers that
//! write nothing (a 409 `state_conflict`, a 412, a replay by `reference`) are kept
//! after the action: a re-run of those finds the same state, since a spent token stays
//! spent and versions only grow (a 412 naming a version the token has not reached yet is
//! not kept: a re-run could find it reached; nor is a 404: the token may be found). On a deployment without transactions
//! (a standalone server) the answer is kept after the write instead, which a crash in
//! between can lose.
//!
//! Not every answer is kept. A 5xx says nothing of what happened, so the key is released
//! and a retry runs the action again (an action that committed has its answer kept
//! already, which the release leaves alone). Nor is a refusal of the request itself (a
//! bad body, a missing `If-Match`, the key's scope, the rate limit): the action never
//! ran, and the corrected request may use the same key. Nor a refusal a retry may
//! legitimately pass (`Finality::Transient`: the token kept changing, an `If-Match` of a
//! version it has not reached, too few tokens to redeem): nothing was done, and the same
//! request may succeed later.

use std::sync::atomic::{AtomicBool, Ordering};

use mongodb::bson::{Binary, oid::ObjectId, spec::BinarySubtype};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::Issuer;
use crate::domain::IdempotencyKey;
use crate::store::{
    AnswerInTransaction, Claimed, HeldRecord, IdempotencyClaim, StoreError, StoredAnswer,
    StoredHeader, retry,
};

/// Answers that refuse the request before its action could run (400 malformed, 403
/// scope, 404 no such token, 413 too large, 415 not JSON, 422 invalid, 428 no
/// `If-Match`, 429 rate limited). They are not kept: nothing happened, so the corrected
/// request may reuse the key (payment APIs save no result for a request that failed
/// validation either). A 404 may also be a read that is behind: a new primary's majority
/// without a token a 201 named yet; kept, it would answer every retry 404 for
/// `retention`. The action's own refusals (409, 412) are kept: they are what happened to
/// it, unless they are `Finality::Transient`.
const REFUSED_BEFORE_THE_ACTION: [u16; 8] = [400, 403, 404, 413, 415, 422, 428, 429];

/// Held records taken back at once, at most (`Issuer::take_back_held_record`).
const MAX_TAKE_BACKS: usize = 16;
static TAKING_BACK: Semaphore = Semaphore::const_new(MAX_TAKE_BACKS);

/// Whether an answer says for good what became of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finality {
    /// What happened to the request; kept unless its status says otherwise.
    Final,
    /// A refusal the same request may pass later (the token kept changing while the
    /// request ran; an `If-Match` naming a version the token has not reached yet; fewer
    /// active tokens than a redemption asks): nothing was done, so it is not kept, and a
    /// retry runs the action again.
    Transient,
}

/// Whether an answer of `status` is kept for the key's retries.
fn is_kept(status: u16, finality: Finality) -> bool {
    finality == Finality::Final && status < 500 && !REFUSED_BEFORE_THE_ACTION.contains(&status)
}

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
    held: HeldRecord,
    /// Set once the record needs nothing more from this attempt: its answer committed
    /// with its action, or another attempt took the key over.
    settled: AtomicBool,
}

impl Attempt {
    fn new(held: HeldRecord) -> Self {
        Self {
            held,
            settled: AtomicBool::new(false),
        }
    }

    /// Marks the record as needing nothing more from this attempt.
    pub(super) fn settle(&self) {
        self.settled.store(true, Ordering::Release);
    }

    /// The record an action's transaction answers for this attempt, with the answer
    /// `answer` gives to the action's result.
    pub(super) fn in_transaction<'a, T: ?Sized>(
        &self,
        answer: &'a (dyn Fn(&T) -> StoredAnswer + Send + Sync),
    ) -> AnswerInTransaction<'a, T> {
        AnswerInTransaction {
            record: self.held.id,
            attempt: self.held.attempt,
            answer,
        }
    }
}

/// An action run under an `Idempotency-Key`: the attempt holding the key, and how the
/// answer to the action's result reads (`T`: the token or the redemption written), so
/// that the write commits with its answer.
pub struct Keyed<'a, T: ?Sized> {
    pub attempt: &'a Attempt,
    pub answer: &'a (dyn Fn(&T) -> Answer + Send + Sync),
}

impl<T: ?Sized> Keyed<'_, T> {
    /// The answer to `written`, as the record keeps it.
    pub(super) fn stored(&self, written: &T) -> StoredAnswer {
        StoredAnswer::from(&(self.answer)(written))
    }
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
        // The attempt of another request whose record this one failed to take over.
        let mut not_taken: Option<ObjectId> = None;
        for _ in 0..retry::IDEMPOTENCY_CLAIM.max_attempts {
            let attempt = ObjectId::new();
            let claim = IdempotencyClaim {
                id: ObjectId::new(),
                key_id: request.key_id,
                key: request.key.as_str(),
                method: request.method,
                path: request.path,
                body_sha256: &body_sha256,
                attempt,
                lease: config.lease,
                retention: config.retention,
            };
            let held = |id| HeldRecord {
                key_id: request.key_id.to_owned(),
                key: request.key.as_str().to_owned(),
                id,
                attempt,
            };
            let claimed = match self.store.claim_idempotency_record(&claim).await {
                Ok(claimed) => claimed,
                Err(err) => {
                    self.take_back_held_record(&err, held(claim.id));
                    return Err(err);
                }
            };
            let existing = match claimed {
                Claimed::Fresh => return Ok(Begun::Proceed(Attempt::new(held(claim.id)))),
                Claimed::Existing(existing) => *existing,
                Claimed::Raced => continue,
                // An attempt's transaction holds the record: it is committing, or died
                // mid-commit and the server has yet to end it. Or the majority is behind
                // on another attempt's unanswered record. Either way, not yet.
                Claimed::Held => return Ok(Begun::InProgress),
            };
            let another_request = existing.method != request.method
                || existing.path != request.path
                || existing.body_sha256 != body_sha256;
            if let Some(answer) = existing.answer {
                if another_request {
                    return Ok(Begun::Reused);
                }
                return Ok(Begun::Replay(answer.into()));
            }
            // No answer: the holder is running, or ended without one (its request was
            // dropped or timed out, or its instance died, or storing or releasing its
            // answer failed). The database's clock says which: a lease that is over is
            // taken over, and this attempt runs. Also for another request: where an action
            // commits with its answer, nothing of an unanswered one took effect, and the
            // key is as free as a released one. Without transactions it may have.
            if another_request
                && (not_taken == Some(existing.attempt)
                    || !self.store.supports_transactions().await?)
            {
                return Ok(Begun::Reused);
            }
            let taken_over = match self
                .store
                .take_over_idempotency_record(&existing, &claim)
                .await
            {
                Ok(taken_over) => taken_over,
                Err(err) => {
                    self.take_back_held_record(&err, held(existing.id));
                    return Err(err);
                }
            };
            if taken_over {
                return Ok(Begun::Proceed(Attempt::new(held(existing.id))));
            }
            if another_request {
                // Its lease still runs, or another request took the key first (one like
                // this one, perhaps): read the record again to tell.
                not_taken = Some(existing.attempt);
                continue;
            }
            return Ok(Begun::InProgress);
        }
        // Another attempt kept winning the key meanwhile: it is running.
        Ok(Begun::InProgress)
    }

    /// After a write of `held` that failed with `err` (a claim, a take-over, or the
    /// keeping of an answer not given): when the database was unavailable the claim may
    /// stand although unconfirmed (a write concern error comes after the write), and
    /// left there it would answer the key's retries 409 `request_in_progress` until its
    /// lease ends, for an attempt whose answer no client heard. It is deleted if it
    /// still names this attempt and has no answer, in the background so that the 503 is
    /// not held up by a second wait for the same majority. The delete waits
    /// for the majority at most `HELD_PATIENCE` (`release_idempotency_record`), and at
    /// most `MAX_TAKE_BACKS` run at once, so an outage of the majority cannot fill the
    /// connection pool with them; a claim not taken back is ended by its lease.
    fn take_back_held_record(&self, err: &StoreError, held: HeldRecord) {
        if !matches!(err, StoreError::Unavailable(_)) {
            return;
        }
        let Ok(permit) = TAKING_BACK.try_acquire() else {
            tracing::warn!("too many idempotency records to take back; their leases will end them");
            return;
        };
        let store = self.store.clone();
        let taking_back = async move {
            let _permit = permit;
            if let Err(err) = store.release_idempotency_record(&held).await {
                tracing::warn!(error = %err, "an idempotency record could not be taken back; its lease will end it");
            }
        };
        tokio::spawn(taking_back.instrument(tracing::Span::current()));
    }

    /// Keeps `answer` for the key's retries, or releases the key when the answer is a 5xx
    /// (nothing is known of what happened, so a retry must run the action again), a
    /// refusal of the request itself (`REFUSED_BEFORE_THE_ACTION`) or a transient one.
    /// Nothing to do when the answer committed with the action, or the key was taken over.
    ///
    /// `Err`: an answer to keep that could not be kept. It must not be given: it wrote
    /// nothing (an action that writes commits its answer with it), so its retry runs the
    /// action again, and may find otherwise (a token a withdrawal revoked, active again
    /// once the money came back). The caller answers the error instead (503 when the
    /// database was unavailable, and the key is then taken back in the background).
    /// On a standalone, where nothing commits an answer with its write, the action may
    /// have written: its answer is given, and the record left to its lease. A release
    /// that fails leaves the record to its lease too: the answer is not kept either way.
    pub async fn finish_idempotent(
        &self,
        attempt: &Attempt,
        answer: &Answer,
        finality: Finality,
    ) -> Result<(), StoreError> {
        if attempt.settled.load(Ordering::Acquire) {
            return Ok(());
        }
        if !is_kept(answer.status, finality) {
            if let Err(err) = self.store.release_idempotency_record(&attempt.held).await {
                tracing::warn!(error = %err, "could not release an idempotency key; its lease will end it");
            }
            return Ok(());
        }
        let stored = StoredAnswer::from(answer);
        match self
            .store
            .store_idempotent_answer(attempt.held.id, attempt.held.attempt, &stored)
            .await
        {
            Ok(true) => {}
            // Held past its lease and taken over: the attempt that took over answers.
            Ok(false) => {
                tracing::warn!("an idempotency key's lease ended before its answer was stored");
            }
            Err(err) => {
                // Not knowing: the safer side, an answer not given.
                if self.store.supports_transactions().await.unwrap_or(true) {
                    self.take_back_held_record(&err, attempt.held.clone());
                    return Err(err);
                }
                tracing::warn!(error = %err, "could not keep the answer of an idempotency key; its lease will end it");
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_happened_is_kept_and_what_may_change_is_not() {
        use Finality::{Final, Transient};
        // What the action did or refused for good: kept.
        for status in [200, 201, 409, 412] {
            assert!(is_kept(status, Final), "{status}");
        }
        // Refused before the action, said nothing (5xx), or a refusal a retry may pass.
        for status in [400, 403, 404, 413, 415, 422, 428, 429, 500, 503] {
            assert!(!is_kept(status, Final), "{status}");
        }
        for status in [200, 409] {
            assert!(!is_kept(status, Transient), "{status}");
        }
    }
}
