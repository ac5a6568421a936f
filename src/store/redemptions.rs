//! `redemptions`, and the transaction that spends tokens by amount: read the tokens
//! `issuing` says may be spent, in the order it says, let its plan choose which and what
//! to write, redeem those and insert the record naming them, and (under an
//! `Idempotency-Key`) answer the key's record — all committed together or not at all.
//! A competing writer of the same tokens (another redemption, a refund's revoke, a single
//! redeem), of the same (owner, reference) or of the key's record makes the attempt end
//! with nothing written; whether and when to try again is the caller's to decide.

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use mongodb::error::Error;
use serde::{Deserialize, Serialize};

use super::documents::TokenDoc;
use super::durability::{abort_quietly, start_snapshot_transaction};
use super::error::{StoreError, duplicate_key_index, is_transient_transaction_error};
use super::idempotency::AnswerInTransaction;
use super::indexes::REDEMPTIONS_REFERENCE_INDEX;
use super::tokens::{TokenQuery, token_filter};
use super::{Store, TOKENS};
use crate::domain::TokenStatus;

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

/// A redemption and its tokens, in the order they were chosen.
#[derive(Debug, Clone)]
pub struct Redeemed {
    pub record: RedemptionDoc,
    pub tokens: Vec<TokenDoc>,
}

/// Which tokens a redemption may spend, in which order, and how many it reads.
#[derive(Debug, Clone)]
pub struct Spendable {
    pub query: TokenQuery,
    /// The sort of the read, e.g. `{ "_id": 1 }`.
    pub order: Document,
    pub limit: i64,
}

/// What a plan chose from the tokens it was shown: the fields to set on each token it
/// redeems (besides the version's increment), and the record naming those tokens
/// (`tokenIds`).
#[derive(Debug, Clone)]
pub struct SpendPlan {
    pub set: Document,
    pub record: RedemptionDoc,
}

/// How one transaction attempt ended.
#[derive(Debug)]
pub enum RedemptionAttempt<R> {
    /// Committed: the record and the tokens as redeemed, in the chosen order.
    Committed(Redeemed),
    /// The plan refused what it was shown; nothing was written.
    Refused(R),
    /// Another writer had one of the tokens, or the reference, first; nothing was written.
    Conflict,
    /// The owner has a redemption of that reference already; nothing was written.
    ReferenceTaken,
    /// Another attempt holds the `Idempotency-Key`'s record now; nothing was written.
    TakenOver,
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
        let found: Vec<TokenDoc> = self
            .db
            .collection::<TokenDoc>(TOKENS)
            .find(doc! { "_id": { "$in": ids } })
            .await?
            .try_collect()
            .await?;
        Ok(in_order(found, ids))
    }

    /// One transaction: reads `spendable`, asks `plan` what to do with what it read (or
    /// for a refusal), redeems the record's `tokenIds` still active with the plan's
    /// fields, inserts the record, answers `answered`'s record when given, and commits.
    pub async fn redeem_in_transaction<R>(
        &self,
        spendable: &Spendable,
        plan: impl FnOnce(&[TokenDoc]) -> Result<SpendPlan, R>,
        answered: Option<&AnswerInTransaction<'_, Redeemed>>,
    ) -> Result<RedemptionAttempt<R>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        start_snapshot_transaction(&mut session).await?;
        let result = self
            .redeem_in_session(&mut session, spendable, plan, answered)
            .await;
        if !matches!(result, Ok(RedemptionAttempt::Committed(..))) {
            abort_quietly(&mut session).await;
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
        spendable: &Spendable,
        plan: impl FnOnce(&[TokenDoc]) -> Result<SpendPlan, R>,
        answered: Option<&AnswerInTransaction<'_, Redeemed>>,
    ) -> Result<RedemptionAttempt<R>, Error> {
        let tokens = self.db.collection::<TokenDoc>(TOKENS);
        let found: Vec<TokenDoc> = tokens
            .find(token_filter(&spendable.query))
            .sort(spendable.order.clone())
            .limit(spendable.limit)
            .session(&mut *session)
            .await?
            .stream(&mut *session)
            .try_collect()
            .await?;
        let SpendPlan { set, record } = match plan(&found) {
            Ok(chosen) => chosen,
            Err(refused) => return Ok(RedemptionAttempt::Refused(refused)),
        };
        let ids = &record.token_ids;
        let written = tokens
            .update_many(
                doc! { "_id": { "$in": ids }, "status": TokenStatus::Active.as_str() },
                doc! { "$set": set.clone(), "$inc": { "_version": 1 } },
            )
            .session(&mut *session)
            .await?;
        // In a snapshot transaction a token changed since the read is a write conflict,
        // not a miss; this only guards the all-or-nothing promise should that ever differ.
        if written.modified_count != ids.len() as u64 {
            return Ok(RedemptionAttempt::Conflict);
        }
        self.db
            .collection::<RedemptionDoc>(REDEMPTIONS)
            .insert_one(&record)
            .session(&mut *session)
            .await?;
        // The tokens as the transaction wrote them: the snapshot read plus the plan's
        // fields and the version's increment, exactly what `update_many` applied (every
        // chosen token matched, checked above), without another round trip.
        let redeemed = Redeemed {
            tokens: as_written(&found, ids, &set)?,
            record,
        };
        if !self.answer_and_commit(session, answered, &redeemed).await? {
            return Ok(RedemptionAttempt::TakenOver);
        }
        Ok(RedemptionAttempt::Committed(redeemed))
    }
}

/// The tokens of `found` named by `ids`, in that order, as `{ $set: set, $inc: {
/// _version: 1 } }` leaves them. `set` holds top-level fields only (the plan's), so
/// inserting them into each token's document is what the server's `$set` does.
fn as_written(
    found: &[TokenDoc],
    ids: &[ObjectId],
    set: &Document,
) -> Result<Vec<TokenDoc>, Error> {
    let written = found
        .iter()
        .filter(|token| ids.contains(&token.id))
        .map(|token| {
            let mut document = mongodb::bson::to_document(token)?;
            document.extend(set.clone());
            let mut token: TokenDoc = mongodb::bson::from_document(document)?;
            token.version += 1;
            Ok(token)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(in_order(written, ids))
}

/// `found`, in the order of `ids`.
fn in_order(mut found: Vec<TokenDoc>, ids: &[ObjectId]) -> Vec<TokenDoc> {
    found.sort_by_key(|t| ids.iter().position(|id| *id == t.id));
    found
}
