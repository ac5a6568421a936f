//! Spending by amount: a redemption of `quantity` of an owner's active tokens of one
//! type, oldest first, all or nothing, named by the client's `reference` (issuance's
//! pattern: the unique (owner, reference) index is the arbiter, the request's content is
//! bound to it).
//!
//! - The same reference again with the same tokenType and quantity is a replay: the same
//!   tokens, nothing written. Another tokenType or quantity is a conflict.
//! - Fewer active tokens than asked: refused with how many there are, nothing redeemed.
//! - Everything happens in one transaction (`Store::redeem_in_transaction`), from the
//!   reference's lookup to the commit: a crash leaves either no trace or the whole
//!   redemption, and a retry finds the latter. Redemptions of different owners arriving
//!   together share the transaction (`batch`). Under
//!   an `Idempotency-Key` the key's answer (201, the tokens) commits in it too, so a
//!   retry with the key is answered 201 with the same body even when the first answer
//!   never reached the client.
//! - Which tokens are spent, in which order, and what is written on them is decided
//!   here (`spendable`, `plan`); the store runs the transaction.
//! - Concurrent writers of the same tokens — other redemptions, a refund's revoke, single
//!   redeems — conflict inside the transaction: it is retried from a fresh read, so no
//!   token is redeemed twice, and a token a refund revoked is never redeemed (a token a
//!   redemption committed first is the refund's shortfall).

use std::time::{Duration, Instant};

use mongodb::bson::{DateTime, doc, oid::ObjectId};
use rand::RngExt;
use serde_json::{Value, json};

use super::tokens::redeemed_fields;
use super::{Issuer, Keyed};
use crate::domain::{AccountGrant, Mismatch, NewRedemption, TokenStatus};
use crate::store::{
    AnswerInTransaction, RedemptionAttempt, RedemptionDoc, Spend, SpendPlan, Spendable, StoreError,
    TokenDoc, TokenQuery,
};
use crate::telemetry::metric;

pub use crate::store::Redeemed;

pub(super) mod batch;

/// How long one request keeps retrying a redemption that loses races: below the default
/// `server.request_timeout_ms`, so a request that cannot get through hears "retry" (503)
/// rather than a timeout. Each lost race means another redemption committed, so under
/// contention this bounds the wait, not the progress.
const CONFLICT_BUDGET: Duration = Duration::from_secs(5);
/// The longest pause between two attempts, in milliseconds.
const MAX_PAUSE_MS: u64 = 25;

/// What a redemption request did.
#[derive(Debug)]
pub enum RedemptionOutcome {
    /// Redeemed now.
    Created(Redeemed),
    /// The owner's redemption of this reference, with the same parameters, existed.
    Replayed(Redeemed),
}

/// Why a redemption was refused. Nothing was written for any of these.
#[derive(Debug, thiserror::Error)]
pub enum RedemptionError {
    /// The reference was used with other parameters (for a key that may not see that
    /// redemption, only `reference`, without the existing value).
    #[error("the reference names a redemption with other parameters")]
    Conflict(Vec<Mismatch>),
    /// Fewer active tokens than asked.
    #[error("only {available} active tokens")]
    Insufficient { available: u64 },
    /// Lost races for longer than the budget.
    #[error("the tokens kept changing")]
    Contended,
    /// The transaction's snapshot (the primary's latest) kept showing a redemption of the
    /// reference that a majority read did not find, for longer than the budget: the
    /// majority lags behind the primary, and the redemption may yet be rolled back.
    #[error("the reference's redemption is not on the majority yet")]
    AwaitingMajority,
    /// The `Idempotency-Key`'s lease ended and another attempt took the key over.
    #[error("another attempt holds the idempotency key")]
    TakenOver,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Issuer {
    /// Redeems `request.quantity` of the owner's active tokens of its type, within its
    /// account and `grants` (the key's accounts) when given. `visible` says whether the
    /// caller may see a token: an existing redemption of the reference with tokens it
    /// may not see is a conflict whose values are not shown. With `keyed`, the key's
    /// answer commits with the redemption.
    pub async fn redeem_amount(
        &self,
        request: &NewRedemption,
        grants: Option<&[AccountGrant]>,
        visible: impl Fn(&TokenDoc) -> bool,
        keyed: Option<Keyed<'_, Redeemed>>,
    ) -> Result<RedemptionOutcome, RedemptionError> {
        // Its record and the tokens it spends.
        self.writes.count(1 + u64::from(request.quantity.get()));
        let started = Instant::now();
        let spendable = spendable(request, grants);
        let stored = keyed
            .as_ref()
            .map(|keyed| move |redeemed: &Redeemed| keyed.stored(redeemed));
        let answered = keyed
            .as_ref()
            .zip(stored.as_ref())
            .map(|(keyed, stored)| keyed.attempt.in_transaction(stored));
        // The id of the record this request writes, the same in each of its attempts: a
        // record found with it is this request's own, written by an attempt whose commit
        // applied but was never confirmed (a batch's, whose redemptions then try again
        // alone), and is answered as created, not as a replay of someone else's.
        let record = ObjectId::new();
        let created = |redeemed: Redeemed| {
            if let Some(keyed) = &keyed {
                keyed.attempt.settle();
            }
            Ok(RedemptionOutcome::Created(redeemed))
        };
        let found = |existing: Redeemed| {
            if existing.record.id == record {
                created(existing)
            } else {
                replay(existing, request, &visible)
            }
        };
        let mut attempt: u64 = 0;
        loop {
            match self
                .attempt(request, record, &spendable, answered.as_ref(), attempt)
                .await?
            {
                RedemptionAttempt::Committed(redeemed) => return created(redeemed),
                // The transaction committed with the majority: what its snapshot showed
                // is the majority's.
                RedemptionAttempt::Exists(Some(existing)) => return found(existing),
                // Answered from a majority read: the snapshot that showed it may hold a
                // redemption a failover can still roll back (one whose commit gave up
                // waiting for the majority). Until the majority has it, it is in the way.
                RedemptionAttempt::Exists(None) => {
                    let existing = self
                        .read_redemption(request.owner.object_id(), request.reference.as_str())
                        .await?;
                    if let Some(existing) = existing {
                        return found(existing);
                    }
                    pause_after_conflict(started, &mut attempt)
                        .await
                        .map_err(|BudgetSpent| RedemptionError::AwaitingMajority)?;
                }
                RedemptionAttempt::Refused(available) => {
                    return Err(RedemptionError::Insufficient { available });
                }
                RedemptionAttempt::TakenOver => {
                    if let Some(keyed) = &keyed {
                        keyed.attempt.settle();
                    }
                    return Err(RedemptionError::TakenOver);
                }
                // Someone else's commit is in the way; the next read sees it (a record
                // of this reference included, then answered as a replay or conflict).
                RedemptionAttempt::Conflict => {
                    metrics::counter!(metric::TRANSACTION_RETRIES_TOTAL).increment(1);
                    pause_after_conflict(started, &mut attempt)
                        .await
                        .map_err(|BudgetSpent| RedemptionError::Contended)?;
                }
            }
        }
    }

    /// One transaction attempt of `request`: its first, unkeyed, in a batch shared with
    /// other owners' redemptions (`batch`); a retry, or one whose key's answer commits
    /// with it, alone, so that a redemption that keeps conflicting never holds up others.
    async fn attempt(
        &self,
        request: &NewRedemption,
        record: ObjectId,
        spendable: &Spendable,
        answered: Option<&AnswerInTransaction<'_, Redeemed>>,
        attempt: u64,
    ) -> Result<RedemptionAttempt<u64>, StoreError> {
        if answered.is_none() && attempt == 0 {
            return self.spender().attempt(request, record, spendable).await;
        }
        let spend = Spend {
            owner: request.owner.object_id(),
            reference: request.reference.as_str(),
            spendable,
            answered,
        };
        let mut attempts = self
            .store
            .redeem_in_transaction(std::slice::from_ref(&spend), |_, found| {
                plan(request, record, found)
            })
            .await?;
        Ok(attempts.pop().unwrap_or(RedemptionAttempt::Conflict))
    }

    /// The owner's redemption of `reference` and its tokens, if the caller may see all
    /// of them.
    pub async fn find_redemption(
        &self,
        owner: ObjectId,
        reference: &str,
        visible: impl Fn(&TokenDoc) -> bool,
    ) -> Result<Option<Redeemed>, StoreError> {
        Ok(self
            .read_redemption(owner, reference)
            .await?
            .filter(|redeemed| redeemed.tokens.iter().all(visible)))
    }

    /// The owner's redemption of `reference` and its tokens, by majority reads.
    async fn read_redemption(
        &self,
        owner: ObjectId,
        reference: &str,
    ) -> Result<Option<Redeemed>, StoreError> {
        let Some(record) = self.store.find_redemption(owner, reference).await? else {
            return Ok(None);
        };
        let tokens = self.store.tokens_by_ids(&record.token_ids).await?;
        Ok(Some(Redeemed { record, tokens }))
    }
}

/// Answers a request whose reference has the redemption `existing`: a replay when the
/// parameters match, else a conflict listing the differing ones.
fn replay(
    existing: Redeemed,
    request: &NewRedemption,
    visible: &impl Fn(&TokenDoc) -> bool,
) -> Result<RedemptionOutcome, RedemptionError> {
    if !existing.tokens.iter().all(visible) {
        return Err(RedemptionError::Conflict(vec![Mismatch {
            field: "reference".to_owned(),
            existing: None,
            requested: json!(request.reference.as_str()),
        }]));
    }
    let mismatches = mismatches(&existing.record, request);
    if !mismatches.is_empty() {
        return Err(RedemptionError::Conflict(mismatches));
    }
    Ok(RedemptionOutcome::Replayed(existing))
}

/// The retry budget (`CONFLICT_BUDGET`) of a request is spent.
struct BudgetSpent;

/// Counts `attempt` as lost and pauses before the next, a little longer each time;
/// `BudgetSpent` once the budget since `started` is spent. A first attempt may have
/// waited its turn in a batch that failed for another's sake: it always gets one
/// attempt alone.
async fn pause_after_conflict(started: Instant, attempt: &mut u64) -> Result<(), BudgetSpent> {
    *attempt += 1;
    if *attempt > 1 && started.elapsed() > CONFLICT_BUDGET {
        return Err(BudgetSpent);
    }
    let ceiling = (*attempt * 2).min(MAX_PAUSE_MS);
    let pause = rand::rng().random_range(1..=ceiling.max(1));
    tokio::time::sleep(Duration::from_millis(pause)).await;
    Ok(())
}

/// The tokens `request` may spend: the owner's active tokens of its type, within its
/// account and the key's accounts when given, oldest first; as many as it asks for.
///
/// Oldest means earliest paid: by the payment's date (`origin.date`), a payment's tokens
/// together in tokenIndex order, ties between payments of one date by payment id, then
/// `_id`. Not `_id` alone: an ObjectId carries the clock of whichever instance (or server)
/// made it, so across instances it is only roughly the order of issue, and never the
/// order of payment. `tokens_owner_type_status_age` (migration 0014) serves this order.
fn spendable(request: &NewRedemption, grants: Option<&[AccountGrant]>) -> Spendable {
    Spendable {
        query: TokenQuery {
            owner: Some(request.owner),
            token_type: Some(request.token_type.clone()),
            status: Some(TokenStatus::Active),
            account: request.account_id.clone(),
            accounts: grants.map(<[AccountGrant]>::to_vec),
            after: None,
        },
        order: doc! {
            "origin.date": 1,
            "origin.paymentIntentId": 1,
            "tokenIndex": 1,
            "_id": 1,
        },
        limit: i64::from(request.quantity.get()),
    }
}

/// What to do with the tokens `found` (read by `spendable`): all of them redeemed, as a
/// single redeem with the request's reference writes them, and the record `record`
/// naming them; refused with how many there are when they are fewer than asked.
fn plan(request: &NewRedemption, record: ObjectId, found: &[TokenDoc]) -> Result<SpendPlan, u64> {
    let quantity = i64::from(request.quantity.get());
    if (found.len() as i64) < quantity {
        return Err(found.len() as u64);
    }
    let now = DateTime::now();
    let reference = request.reference.as_str();
    Ok(SpendPlan {
        set: redeemed_fields(Some(reference), &request.requested_by, now),
        record: RedemptionDoc {
            id: record,
            owner: request.owner.object_id(),
            reference: reference.to_owned(),
            token_type: request.token_type.as_str().to_owned(),
            quantity,
            account_id: request.account_id.as_ref().map(|a| a.as_str().to_owned()),
            token_ids: found.iter().map(|t| t.id).collect(),
            created_at: now,
            requested_by: request.requested_by.as_str().to_owned(),
        },
    })
}

/// The compared parameters that differ: tokenType, quantity and accountId (the request's
/// whole content is bound to its reference: a retry that names another account, or none,
/// must not be answered with the tokens spent from the first one). The owner and
/// reference are the key.
fn mismatches(existing: &RedemptionDoc, request: &NewRedemption) -> Vec<Mismatch> {
    let compared: [(&str, Value, Value); 3] = [
        (
            "tokenType",
            json!(existing.token_type),
            json!(request.token_type.as_str()),
        ),
        (
            "quantity",
            json!(existing.quantity),
            json!(request.quantity.get()),
        ),
        (
            "accountId",
            json!(existing.account_id),
            json!(request.account_id.as_ref().map(|a| a.as_str())),
        ),
    ];
    Mismatch::among(compared)
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use super::*;
    use crate::domain::{AccountId, Actor, Owner, Quantity, RedemptionReference, TokenType};

    #[test]
    fn token_type_quantity_and_account_are_compared() {
        let owner = ObjectId::new();
        let existing = RedemptionDoc {
            id: ObjectId::new(),
            owner,
            reference: "order-1".to_owned(),
            token_type: "standard".to_owned(),
            quantity: 3,
            account_id: Some("acct_1".to_owned()),
            token_ids: Vec::new(),
            created_at: DateTime::now(),
            requested_by: "key:a".to_owned(),
        };
        let request = |token_type: &str, quantity: i64, account: Option<&str>| NewRedemption {
            owner: Owner::from_object_id(owner),
            token_type: TokenType::parse(token_type).unwrap(),
            quantity: Quantity::from_i64(quantity, 1000).unwrap(),
            reference: RedemptionReference::parse("order-1").unwrap(),
            account_id: account.map(|a| AccountId::parse(a).unwrap()),
            requested_by: Actor::api_key("b"),
        };
        assert!(mismatches(&existing, &request("standard", 3, Some("acct_1"))).is_empty());
        for other_account in [Some("acct_2"), None] {
            let found = mismatches(&existing, &request("standard", 3, other_account));
            let fields: Vec<&str> = found.iter().map(|m| m.field.as_str()).collect();
            assert_eq!(fields, ["accountId"], "{other_account:?}");
        }
        let both = mismatches(&existing, &request("premium", 4, Some("acct_1")));
        let fields: Vec<&str> = both.iter().map(|m| m.field.as_str()).collect();
        assert_eq!(fields, ["tokenType", "quantity"]);
        assert_eq!(both[1].existing, Some(json!(3)));
        assert_eq!(both[1].requested, json!(4));
    }
}
