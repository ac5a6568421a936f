//! Reading tokens, and the `_version` gate's write: `_version` (and the status read) in
//! the filter and `$inc: {_version: 1}`, so a write based on a stale read matches nothing.
//! What to write, and what to do when the gate says no, is `issuing`'s to decide. A write
//! under an `Idempotency-Key` commits with its answer, in one transaction.

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;

use super::documents::{TokenDoc, from_document};
use super::durability::{abort_quietly, start_snapshot_transaction};
use super::error::{HELD_PATIENCE, is_transient_transaction_error, ran_out_of_time};
use super::idempotency::AnswerInTransaction;
use super::majority::{Unconfirmed, unconfirmed_find_and_modify};
use super::{Store, StoreError, TOKENS};
use crate::domain::{AccountGrant, AccountId, Owner, TokenId, TokenStatus, TokenType};

/// Filters of a token listing or a redemption's read; `accounts` restricts to a key's
/// accounts, `account` to one account at any provider.
#[derive(Debug, Default, Clone)]
pub struct TokenQuery {
    pub owner: Option<Owner>,
    pub token_type: Option<TokenType>,
    pub status: Option<TokenStatus>,
    pub account: Option<AccountId>,
    pub accounts: Option<Vec<AccountGrant>>,
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
        let mut filter = token_filter(query);
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

    /// Writes `set` to the token and increments `_version`, but only if it is still at
    /// `version` and in the status read (the version gate). `Stale`: another writer got there first
    /// (`matchedCount == 0`); `Conflict`: a transaction still open holds the token (one a
    /// dead instance left, until the server ends it). Nothing was written for either.
    pub async fn write_token_gated(
        &self,
        current: &TokenDoc,
        set: Document,
    ) -> Result<GatedWrite<TokenDoc>, StoreError> {
        let since = Instant::now();
        let written = self
            .collection(TOKENS)
            .find_one_and_update(gate(current), gated_update(set))
            .return_document(ReturnDocument::After)
            .max_time(HELD_PATIENCE)
            .await;
        match written {
            Ok(Some(token)) => Ok(GatedWrite::Written(from_document(token)?)),
            Ok(None) => Ok(GatedWrite::Stale),
            Err(err) if ran_out_of_time(&err) => Ok(GatedWrite::Conflict),
            Err(err) => match unconfirmed_find_and_modify(&err) {
                Some(Unconfirmed::Nothing) => Ok(GatedWrite::Stale),
                Some(Unconfirmed::Wrote(token)) => {
                    self.await_majority(TOKENS, &token, since).await?;
                    Ok(GatedWrite::Written(from_document(token)?))
                }
                None => Err(err.into()),
            },
        }
    }

    /// [`Store::write_token_gated`] and the answer to it in one transaction: the token's
    /// change and `answered`'s record are committed together, or neither is.
    pub async fn write_token_gated_answered(
        &self,
        current: &TokenDoc,
        set: Document,
        answered: &AnswerInTransaction<'_, TokenDoc>,
    ) -> Result<GatedWrite<TokenDoc>, StoreError> {
        let mut session = self.client.start_session().await?;
        start_snapshot_transaction(&mut session).await?;
        let result = self
            .write_and_answer(&mut session, current, set, answered)
            .await;
        if !matches!(result, Ok(GatedWrite::Written(_))) {
            abort_quietly(&mut session).await;
        }
        match result {
            Err(err) if is_transient_transaction_error(&err) => Ok(GatedWrite::Conflict),
            other => Ok(other?),
        }
    }

    async fn write_and_answer(
        &self,
        session: &mut ClientSession,
        current: &TokenDoc,
        set: Document,
        answered: &AnswerInTransaction<'_, TokenDoc>,
    ) -> Result<GatedWrite<TokenDoc>, mongodb::error::Error> {
        let Some(written) = self
            .collection(TOKENS)
            .find_one_and_update(gate(current), gated_update(set))
            .return_document(ReturnDocument::After)
            .session(&mut *session)
            .await?
        else {
            return Ok(GatedWrite::Stale);
        };
        let token =
            from_document(written).map_err(|e| mongodb::error::Error::custom(e.to_string()))?;
        if !self
            .answer_and_commit(session, Some(answered), &token)
            .await?
        {
            return Ok(GatedWrite::TakenOver);
        }
        Ok(GatedWrite::Written(token))
    }
}

/// How a gated write ended; nothing was written but for `Written`.
#[derive(Debug)]
pub enum GatedWrite<T> {
    /// Written (and answered, under a key), as it now is.
    Written(T),
    /// The gate matched nothing: another writer got there first.
    Stale,
    /// Another transaction holds the token (or the key's record): one writing it now, an
    /// attempt taking the record over, or one a dead instance left open.
    Conflict,
    /// Another attempt holds the `Idempotency-Key`'s record now.
    TakenOver,
}

/// The version gate on `current`: its id, in the status read, at the version read. It names the
/// token's payment too — the shard key of a sharded `tokens`, which a `findAndModify`
/// there must name; a token's payment never changes, so it narrows nothing. A token
/// written before the `_version` backfill has no `_version` and is read as version 0:
/// the gate must match it as such (its backfill may still be running while the service
/// serves), and `$inc` on the missing field writes 1.
fn gate(current: &TokenDoc) -> Document {
    let origin = &current.origin;
    let mut filter = doc! {
        "_id": current.id,
        "origin.provider": &origin.provider,
        "origin.accountId": &origin.account_id,
        "origin.paymentIntentId": &origin.payment_intent_id,
        "status": current.status.as_str(),
    };
    let version = current.version;
    if version == 0 {
        filter.insert(
            "$or",
            vec![
                doc! { "_version": 0 },
                doc! { "_version": { "$exists": false } },
            ],
        );
    } else {
        filter.insert("_version", version);
    }
    filter
}

/// `set`, and the version's increment.
fn gated_update(set: Document) -> Document {
    doc! { "$set": set, "$inc": { "_version": 1 } }
}

/// The filter of `query` (but for the listing's cursor).
pub(super) fn token_filter(query: &TokenQuery) -> Document {
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
    if let Some(account) = &query.account {
        filter.insert("origin.accountId", account.as_str());
    }
    if let Some(grants) = &query.accounts {
        filter.insert("$or", accounts_filter(grants));
    }
    filter
}

/// The `$or` clauses of a key's accounts: one for the account ids it has at every
/// provider (always present: an empty `$in` matches nothing, an empty `$or` is refused),
/// one per account it has at one provider.
pub(super) fn accounts_filter(grants: &[AccountGrant]) -> Vec<Document> {
    let anywhere: Vec<&str> = grants
        .iter()
        .filter(|g| g.provider().is_none())
        .map(|g| g.account().as_str())
        .collect();
    let mut clauses = vec![doc! { "origin.accountId": { "$in": anywhere } }];
    for grant in grants {
        if let Some(provider) = grant.provider() {
            clauses.push(doc! {
                "origin.provider": provider.as_str(),
                "origin.accountId": grant.account().as_str(),
            });
        }
    }
    clauses
}
