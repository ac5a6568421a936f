//! Reading tokens and changing their state through the `_version` gate (seed 001).
//!
//! Every state change is a read-modify-write: read the token, decide, then write with
//! `_version` (and `status: active`) in the filter and `$inc: {_version: 1}`. No match
//! means someone else wrote in between: with the client's `If-Match` that is a 412, and
//! without it the store re-reads and re-decides under `Backoff`, then gives up with 409.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;

use super::documents::{TokenDoc, from_document};
use super::retry::Backoff;
use super::{Store, StoreError, TOKENS};
use crate::domain::{Owner, TokenId, TokenStatus, TokenType};

/// A state change a client asks for.
#[derive(Debug, Clone)]
pub enum Transition {
    Redeem { reference: Option<String> },
    Revoke { reason: Option<String> },
    Transfer { new_owner: Owner },
}

impl Transition {
    /// The operation label used in metrics and messages.
    pub fn operation(&self) -> &'static str {
        match self {
            Self::Redeem { .. } => "redeem",
            Self::Revoke { .. } => "revoke",
            Self::Transfer { .. } => "transfer",
        }
    }
}

/// Which version a write must find.
#[derive(Debug, Clone, Copy)]
pub enum Gate {
    /// The client's `If-Match`: a stale version is the client's to resolve (412).
    IfMatch(i64),
    /// No `If-Match`: re-read and retry with backoff.
    Retry,
}

/// How a transition ended. Each carries the token as it now is.
#[derive(Debug)]
pub enum TransitionOutcome {
    Applied(TokenDoc),
    /// Already in the requested end state (revoking a revoked token); nothing written.
    AlreadyDone(TokenDoc),
    /// The token's state forbids the transition.
    StateConflict(TokenDoc),
    /// `If-Match` named another version.
    VersionConflict(TokenDoc),
    /// Kept losing races until the retry policy ran out.
    Contended(TokenDoc),
    NotFound,
}

/// What the transition would do to a token in `status`.
enum Decision {
    Write(Document),
    AlreadyDone,
    Forbidden,
}

fn decide(status: TokenStatus, transition: &Transition, now: DateTime) -> Decision {
    let mut set = doc! { "updatedAt": now };
    match (status, transition) {
        (TokenStatus::Active, Transition::Redeem { reference }) => {
            set.insert("status", TokenStatus::Redeemed.as_str());
            set.insert("redeemedAt", now);
            if let Some(reference) = reference {
                set.insert("redemptionRef", reference.as_str());
            }
        }
        (TokenStatus::Active, Transition::Revoke { reason }) => {
            set.insert("status", TokenStatus::Revoked.as_str());
            set.insert("revokedAt", now);
            if let Some(reason) = reason {
                set.insert("revocationReason", reason.as_str());
            }
        }
        (TokenStatus::Active, Transition::Transfer { new_owner }) => {
            set.insert("owner", new_owner.object_id());
        }
        (TokenStatus::Revoked, Transition::Revoke { .. }) => return Decision::AlreadyDone,
        _ => return Decision::Forbidden,
    }
    Decision::Write(set)
}

/// Filters of a token listing; `accounts` restricts to a key's accounts.
#[derive(Debug, Default, Clone)]
pub struct TokenQuery {
    pub owner: Option<Owner>,
    pub token_type: Option<TokenType>,
    pub status: Option<TokenStatus>,
    pub accounts: Option<Vec<String>>,
    /// Only tokens with `_id` greater than this (the cursor).
    pub after: Option<ObjectId>,
}

impl Store {
    pub async fn find_token(&self, id: TokenId) -> Result<Option<TokenDoc>, StoreError> {
        let found = self
            .collection(TOKENS)
            .find_one(doc! { "_id": id.object_id() })
            .await?;
        found.map(from_document).transpose()
    }

    /// Up to `limit` tokens in `_id` order after the cursor, and the cursor of the next
    /// page when there is one. `_id` order means a walk never repeats or skips a token that
    /// existed when it began, however many are inserted meanwhile.
    pub async fn list_tokens(
        &self,
        query: &TokenQuery,
        limit: u32,
    ) -> Result<(Vec<TokenDoc>, Option<ObjectId>), StoreError> {
        let mut filter = Document::new();
        if let Some(owner) = query.owner {
            filter.insert("owner", owner.object_id());
        }
        if let Some(token_type) = &query.token_type {
            filter.insert("type", token_type.as_str());
        }
        if let Some(status) = query.status {
            filter.insert("status", status.as_str());
        }
        if let Some(accounts) = &query.accounts {
            filter.insert("origin.accountId", doc! { "$in": accounts.clone() });
        }
        if let Some(after) = query.after {
            filter.insert("_id", doc! { "$gt": after });
        }
        // One extra document tells whether another page exists.
        let mut tokens: Vec<TokenDoc> = self
            .db
            .collection::<TokenDoc>(TOKENS)
            .find(filter)
            .sort(doc! { "_id": 1 })
            .limit(i64::from(limit) + 1)
            .await?
            .try_collect()
            .await?;
        let next = if tokens.len() > limit as usize {
            tokens.truncate(limit as usize);
            tokens.last().map(|t| t.id)
        } else {
            None
        };
        Ok((tokens, next))
    }

    /// Applies `transition` to the token through the version gate. `visible` hides tokens
    /// of accounts the caller may not see (they answer as not found).
    pub async fn transition_token(
        &self,
        id: TokenId,
        transition: &Transition,
        gate: Gate,
        visible: impl Fn(&TokenDoc) -> bool,
    ) -> Result<TransitionOutcome, StoreError> {
        let started = Instant::now();
        let mut backoff = Backoff::new(self.config.version_gate);
        loop {
            let Some(current) = self.find_token(id).await?.filter(|t| visible(t)) else {
                return Ok(TransitionOutcome::NotFound);
            };
            if let Gate::IfMatch(expected) = gate
                && expected != current.version
            {
                record_rejection(transition);
                return Ok(TransitionOutcome::VersionConflict(current));
            }
            let set = match decide(current.status, transition, DateTime::now()) {
                Decision::Write(set) => set,
                Decision::AlreadyDone => return Ok(TransitionOutcome::AlreadyDone(current)),
                Decision::Forbidden => return Ok(TransitionOutcome::StateConflict(current)),
            };
            let written = self
                .collection(TOKENS)
                .find_one_and_update(
                    doc! { "_id": current.id, "_version": current.version, "status": "active" },
                    doc! { "$set": set, "$inc": { "_version": 1 } },
                )
                .return_document(ReturnDocument::After)
                .await?;
            if let Some(token) = written {
                return Ok(TransitionOutcome::Applied(from_document(token)?));
            }
            // matchedCount == 0: another writer got there first.
            record_rejection(transition);
            if let Gate::IfMatch(_) = gate {
                return Ok(match self.find_token(id).await? {
                    Some(now) => TransitionOutcome::VersionConflict(now),
                    None => TransitionOutcome::NotFound,
                });
            }
            match backoff.next_delay(started.elapsed()) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Ok(TransitionOutcome::Contended(current)),
            }
        }
    }
}

fn record_rejection(transition: &Transition) {
    metrics::counter!(
        "tokenmint_version_gate_rejections_total",
        "collection" => TOKENS,
        "operation" => transition.operation(),
    )
    .increment(1);
}
