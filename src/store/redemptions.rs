//! `redemptions`, and the transaction that spends tokens by amount: read an owner's
//! active tokens of one type in `_id` order (oldest first, through
//! `tokens_owner_type_status`), let the caller's plan choose, redeem the chosen ones and
//! insert the redemption record naming them — all committed together or not at all.
//! A competing writer of the same tokens (another redemption, a refund's revoke, a single
//! redeem) or of the same (owner, reference) makes the attempt a `Conflict`, with nothing
//! written; whether and when to try again is the caller's to decide.

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use mongodb::error::Error;
use mongodb::options::ReadConcern;
use serde::{Deserialize, Serialize};

use super::atomic::commit_with_retry;
use super::documents::TokenDoc;
use super::error::{StoreError, duplicate_key_index, is_transient_transaction_error};
use super::indexes::REDEMPTIONS_REFERENCE_INDEX;
use super::tokens::accounts_filter;
use super::{Store, TOKENS};
use crate::domain::{AccountGrant, NewRedemption, TokenStatus};

/// The collection's name.
pub const REDEMPTIONS: &str = "redemptions";

/// One document of `redemptions`: what was asked, and the tokens it redeemed, in the
/// order they were chosen.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedemptionDoc {
    #[serde(rename = "_id")]
    pub id: ObjectId,
    pub owner: ObjectId,
    pub reference: String,
    pub token_type: String,
    pub quantity: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    pub token_ids: Vec<ObjectId>,
    pub created_at: DateTime,
    pub requested_by: String,
}

/// How one transaction attempt ended.
#[derive(Debug)]
pub enum RedemptionAttempt<R> {
    /// Committed: the record and the tokens as redeemed, in the chosen order.
    Committed(RedemptionDoc, Vec<TokenDoc>),
    /// The plan refused what it was shown; nothing was written.
    Refused(R),
    /// Another writer had one of the tokens, or the reference, first; nothing was written.
    Conflict,
    /// The owner has a redemption of that reference already; nothing was written.
    ReferenceTaken,
}

impl Store {
    /// The redemption `reference` of `owner`, if there is one.
    pub async fn find_redemption(
        &self,
        owner: ObjectId,
        reference: &str,
    ) -> Result<Option<RedemptionDoc>, StoreError> {
        Ok(self
            .db
            .collection::<RedemptionDoc>(REDEMPTIONS)
            .find_one(doc! { "owner": owner, "reference": reference })
            .await?)
    }

    /// The tokens `ids`, in that order (those that exist).
    pub async fn tokens_by_ids(&self, ids: &[ObjectId]) -> Result<Vec<TokenDoc>, StoreError> {
        let mut found: Vec<TokenDoc> = self
            .db
            .collection::<TokenDoc>(TOKENS)
            .find(doc! { "_id": { "$in": ids } })
            .await?
            .try_collect()
            .await?;
        found.sort_by_key(|t| ids.iter().position(|id| *id == t.id));
        Ok(found)
    }

    /// One transaction: reads up to `request.quantity` active tokens of the owner and
    /// type (within `request.account_id` and `grants` when given) oldest first, asks
    /// `plan` which to redeem (or for a refusal), redeems those and inserts the record.
    pub async fn redeem_in_transaction<R>(
        &self,
        request: &NewRedemption,
        grants: Option<&[AccountGrant]>,
        plan: impl FnOnce(&[TokenDoc]) -> Result<(), R>,
    ) -> Result<RedemptionAttempt<R>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            // The commit inherits the client's pinned `w: majority`, journaled.
            .await?;
        let result = self
            .redeem_in_session(&mut session, request, grants, plan)
            .await;
        if !matches!(result, Ok(RedemptionAttempt::Committed(..))) {
            // Leave nothing behind; the abort's own failure is moot.
            let _ = session.abort_transaction().await;
        }
        match result {
            Err(err)
                if duplicate_key_index(&err).as_deref() == Some(REDEMPTIONS_REFERENCE_INDEX) =>
            {
                Ok(RedemptionAttempt::ReferenceTaken)
            }
            Err(err) if is_transient_transaction_error(&err) => Ok(RedemptionAttempt::Conflict),
            other => Ok(other?),
        }
    }

    async fn redeem_in_session<R>(
        &self,
        session: &mut ClientSession,
        request: &NewRedemption,
        grants: Option<&[AccountGrant]>,
        plan: impl FnOnce(&[TokenDoc]) -> Result<(), R>,
    ) -> Result<RedemptionAttempt<R>, Error> {
        let tokens = self.db.collection::<TokenDoc>(TOKENS);
        let quantity = i64::from(request.quantity.get());
        let chosen: Vec<TokenDoc> = tokens
            .find(active_tokens(request, grants))
            .sort(doc! { "_id": 1 })
            .limit(quantity)
            .session(&mut *session)
            .await?
            .stream(&mut *session)
            .try_collect()
            .await?;
        if let Err(refused) = plan(&chosen) {
            return Ok(RedemptionAttempt::Refused(refused));
        }
        let ids: Vec<ObjectId> = chosen.iter().map(|t| t.id).collect();
        let now = DateTime::now();
        let by = request.requested_by.as_str();
        let written = tokens
            .update_many(
                doc! { "_id": { "$in": &ids }, "status": TokenStatus::Active.as_str() },
                doc! {
                    "$set": {
                        "status": TokenStatus::Redeemed.as_str(),
                        "redeemedAt": now,
                        "redemptionRef": request.reference.as_str(),
                        "updatedAt": now,
                        "lastChangedBy": by,
                    },
                    "$inc": { "_version": 1 },
                },
            )
            .session(&mut *session)
            .await?;
        // In a snapshot transaction a token changed since the read is a write conflict,
        // not a miss; this only guards the all-or-nothing promise should that ever differ.
        if written.modified_count != ids.len() as u64 {
            return Ok(RedemptionAttempt::Conflict);
        }
        let record = RedemptionDoc {
            id: ObjectId::new(),
            owner: request.owner.object_id(),
            reference: request.reference.as_str().to_owned(),
            token_type: request.token_type.as_str().to_owned(),
            quantity,
            account_id: request.account_id.as_ref().map(|a| a.as_str().to_owned()),
            token_ids: ids,
            created_at: now,
            requested_by: by.to_owned(),
        };
        self.db
            .collection::<RedemptionDoc>(REDEMPTIONS)
            .insert_one(&record)
            .session(&mut *session)
            .await?;
        commit_with_retry(session).await?;
        let redeemed = chosen
            .into_iter()
            .map(|mut token| {
                token.status = TokenStatus::Redeemed;
                token.version += 1;
                token.redeemed_at = Some(now);
                token.redemption_ref = Some(record.reference.clone());
                token.updated_at = now;
                token.last_changed_by = Some(by.to_owned());
                token
            })
            .collect();
        Ok(RedemptionAttempt::Committed(record, redeemed))
    }
}

/// The owner's active tokens of the type, within the account and the key's accounts.
fn active_tokens(request: &NewRedemption, grants: Option<&[AccountGrant]>) -> Document {
    let mut filter = doc! {
        "owner": request.owner.object_id(),
        "type": request.token_type.as_str(),
        "status": TokenStatus::Active.as_str(),
    };
    if let Some(account) = &request.account_id {
        filter.insert("origin.accountId", account.as_str());
    }
    if let Some(grants) = grants {
        filter.insert("$or", accounts_filter(grants));
    }
    filter
}
