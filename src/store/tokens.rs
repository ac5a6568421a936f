//! Reading tokens, and the `_version` gate's write: `_version` (and `status: active`) in
//! the filter and `$inc: {_version: 1}`, so a write based on a stale read matches nothing.
//! What to write, and what to do when the gate says no, is `issuing`'s to decide.

use futures::TryStreamExt;
use mongodb::bson::{Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;

use super::documents::{TokenDoc, from_document};
use super::{Store, StoreError, TOKENS};
use crate::domain::{AccountGrant, Owner, TokenId, TokenStatus, TokenType};

/// Filters of a token listing; `accounts` restricts to a key's accounts.
#[derive(Debug, Default, Clone)]
pub struct TokenQuery {
    pub owner: Option<Owner>,
    pub token_type: Option<TokenType>,
    pub status: Option<TokenStatus>,
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
        if let Some(grants) = &query.accounts {
            filter.insert("$or", accounts_filter(grants));
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

    /// Writes `set` to the token and increments `_version`, but only if it is still at
    /// `version` and `active` (the version gate). `None`: another writer got there first
    /// (`matchedCount == 0`), and nothing was written.
    pub async fn write_token_gated(
        &self,
        id: ObjectId,
        version: i64,
        set: Document,
    ) -> Result<Option<TokenDoc>, StoreError> {
        // A token written before the `_version` backfill has no `_version` and is read as
        // version 0: the gate must match it as such (its backfill may still be running
        // while the service serves), and `$inc` on the missing field writes 1.
        let mut filter = doc! { "_id": id, "status": "active" };
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
        let written = self
            .collection(TOKENS)
            .find_one_and_update(filter, doc! { "$set": set, "$inc": { "_version": 1 } })
            .return_document(ReturnDocument::After)
            .await?;
        written.map(from_document).transpose()
    }
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
