//! `redemptions`, and the transaction that spends tokens by amount: read the tokens
//! `issuing` says may be spent, in the order it says, let its plan choose which and what
//! to write, redeem those and insert the record naming them, and (under an
//! `Idempotency-Key`) answer the key's record — all committed together or not at all.
//! A competing writer of the same tokens (another redemption, a refund's revoke, a single
//! redeem), of the same (owner, reference) or of the key's record makes the attempt end
//! with nothing written; whether and when to try again is the caller's to decide.

use std::collections::{HashMap, HashSet};

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::error::Error;
use serde::{Deserialize, Serialize};

use super::atomic::commit_with_retry;
use super::documents::{TokenChange, TokenDoc};
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

/// How one redemption of a transaction attempt ended.
#[derive(Debug)]
pub enum RedemptionAttempt<R> {
    /// Committed: the record and the tokens as redeemed, in the chosen order.
    Committed(Redeemed),
    /// The transaction's snapshot shows a redemption of that reference already; nothing
    /// was written for it. With the record and its tokens as the snapshot showed them
    /// when the transaction committed: its commit at `w: majority` waited for the
    /// majority to have that snapshot, so an answer may rest on them. Without, when it
    /// did not commit: the snapshot is not known to be the majority's, and the record
    /// must be read again (`find_redemption`) before an answer rests on it.
    Exists(Option<Redeemed>),
    /// The plan refused what it was shown; nothing was written for it.
    Refused(R),
    /// Nothing was written: another writer had one of the tokens, or a reference, first
    /// (this redemption's or, in a shared transaction, another one's).
    Conflict,
    /// Another attempt holds the `Idempotency-Key`'s record now; nothing was written.
    TakenOver,
}

/// One redemption of a transaction: the tokens it may spend and, under an
/// `Idempotency-Key`, the record its answer commits with.
pub struct Spend<'a> {
    /// The owner and the reference that name the redemption.
    pub owner: ObjectId,
    pub reference: &'a str,
    pub spendable: &'a Spendable,
    pub answered: Option<&'a AnswerInTransaction<'a, Redeemed>>,
}

/// The redemptions a transaction planned, with what their plans chose and what they read.
struct Planned {
    /// Position in the transaction's spends.
    index: usize,
    found: Vec<TokenDoc>,
    plan: SpendPlan,
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

    /// One transaction for `spends`, one attempt each, in the same order: reads which of
    /// their references exist (answered with the record and its tokens, nothing
    /// written), then each other spend's tokens, and asks `plan` (with the spend's
    /// position) what to do with them, or for a refusal; redeems every planned record's
    /// `tokenIds` still active with its plan's fields in one update, inserts the records
    /// in one insert, answers each `answered` record, and commits. The planned
    /// redemptions commit together or not at all: when one cannot (a token or reference
    /// taken, a key taken over) none is written, and every planned one is told so,
    /// refusals too. A refusal or an existing redemption is answered from the snapshot
    /// only when the transaction committed (an empty one, when there are refusals and
    /// nothing to write), whose commit waited for the majority to have its snapshot.
    /// Any other failure is the whole call's.
    ///
    /// The spends must not share tokens (in practice: one redemption per owner): two
    /// plans choosing the same token leave the update short, which writes nothing.
    pub async fn redeem_in_transaction<R>(
        &self,
        spends: &[Spend<'_>],
        plan: impl FnMut(usize, &[TokenDoc]) -> Result<SpendPlan, R>,
    ) -> Result<Vec<RedemptionAttempt<R>>, StoreError> {
        if !self.supports_transactions().await? {
            return Err(StoreError::TransactionsUnavailable);
        }
        let mut session = self.client.start_session().await?;
        start_snapshot_transaction(&mut session).await?;
        let mut attempts: Vec<Option<RedemptionAttempt<R>>> = spends.iter().map(|_| None).collect();
        let result = self
            .redeem_in_session(&mut session, spends, plan, &mut attempts)
            .await;
        let committed = matches!(result, Ok(Ended::Committed));
        if !committed {
            abort_quietly(&mut session).await;
        }
        match result {
            Ok(Ended::Committed | Ended::Conflict) => {}
            Ok(Ended::TakenOver(index)) => attempts[index] = Some(RedemptionAttempt::TakenOver),
            Err(err)
                if is_transient_transaction_error(&err)
                    || duplicate_key_index(&err).as_deref()
                        == Some(REDEMPTIONS_REFERENCE_INDEX) => {}
            Err(err) => return Err(err.into()),
        }
        // A committed redemption was filled in with its record, a refusal with itself, an
        // existing one with what the snapshot showed of it; any other planned one was not
        // written. A refusal and an existing redemption's tokens stand only when the
        // transaction committed: only then did the majority confirm the snapshot they
        // rest on. Otherwise a refusal tries again, as the planned ones do, and an
        // existing redemption is read again.
        Ok(attempts
            .into_iter()
            .map(|attempt| match attempt {
                Some(RedemptionAttempt::Refused(_)) if !committed => RedemptionAttempt::Conflict,
                Some(RedemptionAttempt::Exists(_)) if !committed => RedemptionAttempt::Exists(None),
                attempt => attempt.unwrap_or(RedemptionAttempt::Conflict),
            })
            .collect())
    }

    /// The reads, the plans, the writes and the commit of `redeem_in_transaction`: fills
    /// `attempts` with the refusals and, once committed, with what each planned
    /// redemption wrote.
    async fn redeem_in_session<R>(
        &self,
        session: &mut ClientSession,
        spends: &[Spend<'_>],
        mut plan: impl FnMut(usize, &[TokenDoc]) -> Result<SpendPlan, R>,
        attempts: &mut [Option<RedemptionAttempt<R>>],
    ) -> Result<Ended, Error> {
        let records = self.existing_redemptions(session, spends).await?;
        let tokens = self.db.collection::<TokenDoc>(TOKENS);
        let mut existing = Vec::new();
        let mut planned = Vec::with_capacity(spends.len());
        for (index, spend) in spends.iter().enumerate() {
            let named =
                |r: &&RedemptionDoc| r.owner == spend.owner && r.reference == spend.reference;
            if let Some(record) = records.iter().find(named) {
                // Read again after the transaction, unless its commit confirms it below.
                attempts[index] = Some(RedemptionAttempt::Exists(None));
                existing.push((index, record.clone()));
                continue;
            }
            let spendable = spend.spendable;
            let found: Vec<TokenDoc> = tokens
                .find(token_filter(&spendable.query))
                .sort(spendable.order.clone())
                .limit(spendable.limit)
                .session(&mut *session)
                .await?
                .stream(&mut *session)
                .try_collect()
                .await?;
            match plan(index, &found) {
                Ok(plan) => planned.push(Planned { index, found, plan }),
                Err(refused) => attempts[index] = Some(RedemptionAttempt::Refused(refused)),
            }
        }
        let refused = attempts
            .iter()
            .any(|attempt| matches!(attempt, Some(RedemptionAttempt::Refused(_))));
        if planned.is_empty() && !refused {
            // Only existing redemptions: they are read again after the transaction, by
            // majority reads, which is what committing it would wait for anyway.
            return Ok(Ended::Conflict);
        }
        // This transaction commits, and its commit confirms the snapshot: the existing
        // redemptions are answered from it, their tokens read here in one go.
        for (index, redeemed) in self.with_tokens(session, existing).await? {
            attempts[index] = Some(RedemptionAttempt::Exists(Some(redeemed)));
        }
        if planned.is_empty() {
            // Nothing to write. A refusal rests on the snapshot, the primary's latest,
            // which may hold a redemption the majority does not have yet (and a failover
            // may roll back): committing the empty transaction with the majority waits
            // until the majority has everything the snapshot showed.
            commit_with_retry(session).await?;
            return Ok(Ended::Committed);
        }
        let chosen: usize = planned.iter().map(|p| p.plan.record.token_ids.len()).sum();
        // In a snapshot transaction a token changed since the read is a write conflict,
        // not a miss; this guards the all-or-nothing promise should that ever differ,
        // and against two plans that chose one token.
        if self.redeem_chosen(session, &planned).await? != chosen as u64 {
            return Ok(Ended::Conflict);
        }
        self.db
            .collection::<RedemptionDoc>(REDEMPTIONS)
            .insert_many(planned.iter().map(|p| &p.plan.record))
            .session(&mut *session)
            .await?;
        let mut redeemed = Vec::with_capacity(planned.len());
        for Planned { index, found, plan } in planned {
            // The tokens as the transaction wrote them: the snapshot read plus the plan's
            // fields and the version's increment, exactly what the update applied (every
            // chosen token matched, checked above), without another round trip.
            let written = Redeemed {
                tokens: as_written(&found, &plan.record.token_ids, &plan.set)?,
                record: plan.record,
            };
            if let Some(answered) = spends[index].answered {
                let answer = (answered.answer)(&written);
                if !self
                    .answer_in_session(session, answered.record, answered.attempt, &answer)
                    .await?
                {
                    return Ok(Ended::TakenOver(index));
                }
            }
            redeemed.push((index, written));
        }
        commit_with_retry(session).await?;
        for (index, written) in redeemed {
            attempts[index] = Some(RedemptionAttempt::Committed(written));
        }
        Ok(Ended::Committed)
    }
}

impl Store {
    /// The records of those of `spends`' references that exist, in one read of the
    /// transaction's snapshot.
    async fn existing_redemptions(
        &self,
        session: &mut ClientSession,
        spends: &[Spend<'_>],
    ) -> Result<Vec<RedemptionDoc>, Error> {
        let named: Vec<Document> = spends
            .iter()
            .map(|spend| doc! { "owner": spend.owner, "reference": spend.reference })
            .collect();
        self.db
            .collection::<RedemptionDoc>(REDEMPTIONS)
            .find(doc! { "$or": named })
            .session(&mut *session)
            .await?
            .stream(&mut *session)
            .try_collect()
            .await
    }

    /// `records` (each with its spend's position), each with its tokens in the order
    /// they were chosen: all their tokens in one read of the transaction's snapshot,
    /// none when there are no records.
    async fn with_tokens(
        &self,
        session: &mut ClientSession,
        records: Vec<(usize, RedemptionDoc)>,
    ) -> Result<Vec<(usize, Redeemed)>, Error> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<ObjectId> = records
            .iter()
            .flat_map(|(_, record)| record.token_ids.iter().copied())
            .collect();
        let tokens: HashMap<ObjectId, TokenDoc> = self
            .db
            .collection::<TokenDoc>(TOKENS)
            .find(doc! { "_id": { "$in": ids } })
            .session(&mut *session)
            .await?
            .stream(&mut *session)
            .map_ok(|token| (token.id, token))
            .try_collect()
            .await?;
        Ok(records
            .into_iter()
            .map(|(index, record)| {
                let tokens = record
                    .token_ids
                    .iter()
                    .filter_map(|id| tokens.get(id).cloned())
                    .collect();
                (index, Redeemed { record, tokens })
            })
            .collect())
    }

    /// Runs `redeem_command` in the session's transaction; returns how many tokens it
    /// redeemed. A conflict with another writer fails the command itself (as a transient
    /// transaction error); any statement's write error ends the transaction.
    async fn redeem_chosen(
        &self,
        session: &mut ClientSession,
        planned: &[Planned],
    ) -> Result<u64, Error> {
        let reply = self
            .db
            .run_command(redeem_command(planned))
            .session(&mut *session)
            .await?;
        if let Ok(errors) = reply.get_array("writeErrors") {
            let code = errors
                .first()
                .and_then(Bson::as_document)
                .and_then(|error| error.get_i32("code").ok());
            return Err(Error::custom(format!(
                "a redemption's token update failed (code {code:?})"
            )));
        }
        let modified = match reply.get("nModified") {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            _ => return Err(Error::custom("an update reply without nModified")),
        };
        Ok(modified as u64)
    }
}

/// How a transaction's writes ended, when no command failed.
enum Ended {
    Committed,
    /// Nothing to commit (only existing redemptions), or a token no longer as read.
    Conflict,
    /// The spend at this position lost its `Idempotency-Key`'s record.
    TakenOver(usize),
}

/// The `update` command that redeems every planned redemption's chosen tokens still
/// active: one statement per plan, since each writes its own reference on its tokens.
/// MongoDB 6.0 has no `bulkWrite` command, so the statements share one `update`: one
/// round trip, whatever the batch's size.
fn redeem_command(planned: &[Planned]) -> Document {
    let updates: Vec<Document> = planned
        .iter()
        .map(|Planned { plan, .. }| {
            doc! {
                "q": {
                    "_id": { "$in": &plan.record.token_ids },
                    "status": TokenStatus::Active.as_str(),
                },
                "u": { "$set": plan.set.clone(), "$inc": { "_version": 1 } },
                "multi": true,
            }
        })
        .collect();
    doc! { "update": TOKENS, "updates": updates, "ordered": true }
}

/// The tokens of `found` named by `ids`, in that order, as `{ $set: set, $inc: {
/// _version: 1 } }` leaves them.
fn as_written(
    found: &[TokenDoc],
    ids: &[ObjectId],
    set: &Document,
) -> Result<Vec<TokenDoc>, Error> {
    let change = TokenChange::of(set)?;
    let chosen: HashSet<&ObjectId> = ids.iter().collect();
    let written = found
        .iter()
        .filter(|token| chosen.contains(&token.id))
        .map(|token| {
            let mut token = change.applied_to(token);
            token.version += 1;
            token
        })
        .collect();
    Ok(in_order(written, ids))
}

/// `found`, in the order of `ids`. Through a map of positions: a redemption may name
/// `issuance.max_quantity` tokens, and a search of `ids` per token would cost the square
/// of that on the runtime's thread.
fn in_order(mut found: Vec<TokenDoc>, ids: &[ObjectId]) -> Vec<TokenDoc> {
    let position: HashMap<&ObjectId, usize> =
        ids.iter().enumerate().map(|(i, id)| (id, i)).collect();
    found.sort_by_key(|t| position.get(&t.id).copied());
    found
}
