//! The token state machine behind redeem, revoke and transfer, through the `_version`
//! gate: read the token, decide, then write only if it is still at the version read.
//! A lost race with the client's `If-Match` is the client's to resolve (412); without
//! it, the token is re-read and the decision re-made under a backoff, then given up (409).
//! Under an `Idempotency-Key` the write commits with its answer (`Keyed`).

use std::time::Instant;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{DateTime, Document, doc};

use super::{Issuer, Keyed};
use crate::domain::{Actor, Owner, TokenId, TokenStatus};
use crate::store::{Backoff, GatedWrite, StoreError, TOKENS, TokenDoc};
use crate::telemetry::metric;

/// A state change a client asks for.
#[derive(Debug, Clone)]
pub enum Transition {
    Redeem { reference: Option<String> },
    Revoke { reason: Option<String> },
    Transfer { new_owner: Owner },
}

impl Transition {
    /// Whether `token` is what this transition made of it already, so that asking again
    /// is a retry: a redeem whose non-empty `reference` the redeemed token carries (a
    /// redemption's tokens carry its reference too). Another or no reference says
    /// nothing of who redeemed it.
    pub fn is_replayed_by(&self, token: &TokenDoc) -> bool {
        match self {
            Self::Redeem {
                reference: Some(reference),
            } => {
                token.status == TokenStatus::Redeemed
                    && !reference.is_empty()
                    && token.redemption_ref.as_deref() == Some(reference.as_str())
            }
            _ => false,
        }
    }

    /// Whether a request whose `If-Match` named only versions older than `token`'s is a
    /// retry of `by`'s own first attempt, whose answer was lost: `by` made the token's
    /// last change, and the token shows what this transition would make of it (revoked,
    /// or the new owner's). RFC 9110 lets a request whose change is made succeed, so the
    /// retry is answered as its first attempt was, not 412. Only `by`'s own change
    /// counts: another's, even the same, is told as a stale tag, so that a key that may
    /// not read tokens learns nothing by sending wrong tags. A tag newer than the token
    /// is a read that is behind (a new primary), never a retry: the callers ask this only
    /// of older tags. A redeem never is: a retried redeem names its `reference`
    /// (`is_replayed_by`).
    pub fn is_own_change_retried(&self, token: &TokenDoc, by: &Actor) -> bool {
        token.last_changed_by.as_deref() == Some(by.as_str())
            && matches!(
                decide(
                    token.status,
                    was_withdrawn(token),
                    token.owner,
                    self,
                    by,
                    DateTime::now()
                ),
                Decision::AlreadyDone
            )
    }

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
    /// Already in the requested end state (revoking a revoked token, transferring a token
    /// to its owner), or the caller's own change retried under its first attempt's
    /// `If-Match`; nothing written.
    AlreadyDone(TokenDoc),
    /// The token's state forbids the transition.
    StateConflict(TokenDoc),
    /// `If-Match` named another version.
    VersionConflict(TokenDoc),
    /// A retried redeem: the token was redeemed with this request's `reference`
    /// already; nothing written.
    Replayed(TokenDoc),
    /// Kept losing races until the retry policy ran out.
    Contended(TokenDoc),
    NotFound,
    /// The `Idempotency-Key`'s lease ended and another attempt took the key over: this
    /// one wrote nothing, the other answers.
    TakenOver,
}

/// What the transition would do to a token in `status`.
enum Decision {
    Write(Document),
    AlreadyDone,
    Forbidden,
}

/// What redeeming an active token writes, for `by`, with the client's `reference`: one
/// home for a single redeem and a redemption's tokens.
pub(super) fn redeemed_fields(reference: Option<&str>, by: &Actor, now: DateTime) -> Document {
    let mut set = doc! {
        "updatedAt": now,
        "lastChangedBy": by.as_str(),
        "status": TokenStatus::Redeemed.as_str(),
        "redeemedAt": now,
    };
    if let Some(reference) = reference {
        set.insert("redemptionRef", reference);
    }
    set
}

/// The state machine: only an active token changes; transferring a token to the `owner`
/// it has is a no-op, and so is revoking a revoked one, but for a token a withdrawal
/// revoked (`withdrawn`: its last author is a provider): the revoke then makes `by` its
/// author, so that money coming back, which makes active again only what the provider
/// revoked, leaves it revoked. Every write names its author
/// (`lastChangedBy`).
fn decide(
    status: TokenStatus,
    withdrawn: bool,
    owner: ObjectId,
    transition: &Transition,
    by: &Actor,
    now: DateTime,
) -> Decision {
    let mut set = doc! { "updatedAt": now, "lastChangedBy": by.as_str() };
    match (status, transition) {
        (TokenStatus::Revoked, Transition::Revoke { reason }) if withdrawn && !by.is_provider() => {
            // `revokedAt` stays the withdrawal's: the token has been revoked since.
            if let Some(reason) = reason {
                set.insert("revocationReason", reason.as_str());
            }
        }
        (TokenStatus::Active, Transition::Redeem { reference }) => {
            return Decision::Write(redeemed_fields(reference.as_deref(), by, now));
        }
        (TokenStatus::Active, Transition::Revoke { reason }) => {
            set.insert("status", TokenStatus::Revoked.as_str());
            set.insert("revokedAt", now);
            if let Some(reason) = reason {
                set.insert("revocationReason", reason.as_str());
            }
        }
        (TokenStatus::Active, Transition::Transfer { new_owner })
            if new_owner.object_id() == owner =>
        {
            return Decision::AlreadyDone;
        }
        (TokenStatus::Active, Transition::Transfer { new_owner }) => {
            set.insert("owner", new_owner.object_id());
            // Marks the owner as changed on purpose, so `verify` does not report it as
            // differing from the issuance record.
            set.insert("transferredAt", now);
        }
        (TokenStatus::Revoked, Transition::Revoke { .. }) => return Decision::AlreadyDone,
        _ => return Decision::Forbidden,
    }
    Decision::Write(set)
}

impl Issuer {
    /// Applies `transition` to the token through the version gate, on behalf of `by`.
    /// `visible` hides tokens of accounts the caller may not see (they answer as not found).
    /// With `keyed`, a write commits with its answer (where the deployment has
    /// transactions).
    pub async fn transition_token(
        &self,
        id: TokenId,
        transition: &Transition,
        gate: Gate,
        by: &Actor,
        visible: impl Fn(&TokenDoc) -> bool,
        keyed: Option<Keyed<'_, TokenDoc>>,
    ) -> Result<TransitionOutcome, StoreError> {
        self.writes.count(1);
        let keyed = match keyed {
            Some(keyed) if self.store.supports_transactions().await? => Some(keyed),
            // A standalone server: the answer is kept after the write.
            _ => None,
        };
        let stored = keyed
            .as_ref()
            .map(|keyed| move |token: &TokenDoc| keyed.stored(token));
        let answered = keyed
            .as_ref()
            .zip(stored.as_ref())
            .map(|(keyed, stored)| keyed.attempt.in_transaction(stored));
        let started = Instant::now();
        let mut backoff = Backoff::new(self.store.version_gate_policy());
        loop {
            let Some(current) = self.store.find_token(id).await?.filter(|t| visible(t)) else {
                return Ok(TransitionOutcome::NotFound);
            };
            // Before the version: a retry's If-Match names the version before its own
            // first attempt, and it is answered as that attempt was.
            if transition.is_replayed_by(&current) {
                return Ok(TransitionOutcome::Replayed(current));
            }
            if let Gate::IfMatch(expected) = gate
                && expected != current.version
            {
                if expected < current.version && transition.is_own_change_retried(&current, by) {
                    return Ok(TransitionOutcome::AlreadyDone(current));
                }
                record_rejection(transition);
                return Ok(TransitionOutcome::VersionConflict(current));
            }
            let set = match decide(
                current.status,
                was_withdrawn(&current),
                current.owner,
                transition,
                by,
                DateTime::now(),
            ) {
                Decision::Write(set) => set,
                Decision::AlreadyDone => return Ok(TransitionOutcome::AlreadyDone(current)),
                Decision::Forbidden => return Ok(TransitionOutcome::StateConflict(current)),
            };
            let written = match &answered {
                Some(answered) => {
                    self.store
                        .write_token_gated_answered(&current, set, answered)
                        .await?
                }
                None => self.store.write_token_gated(&current, set).await?,
            };
            // Whether the change in the way is on the primary only, as far as we can tell.
            let lagging = match written {
                GatedWrite::Written(token) => {
                    if let Some(keyed) = &keyed {
                        keyed.attempt.settle();
                    }
                    return Ok(TransitionOutcome::Applied(token));
                }
                GatedWrite::TakenOver => {
                    if let Some(keyed) = &keyed {
                        keyed.attempt.settle();
                    }
                    return Ok(TransitionOutcome::TakenOver);
                }
                // matchedCount == 0: the token moved since it was read.
                GatedWrite::Stale => {
                    record_rejection(transition);
                    match self.store.find_token(id).await? {
                        None => return Ok(TransitionOutcome::NotFound),
                        // Still the version the write missed: the change in the way is
                        // on the primary, not yet the majority's (a write on its way to
                        // the secondaries, or lagging ones). Whose it is — this request's
                        // own first attempt, answered 5xx, or another's — shows once the
                        // majority has it: look again after a pause.
                        Some(now) if now.version == current.version => true,
                        Some(now) if transition.is_replayed_by(&now) => {
                            return Ok(TransitionOutcome::Replayed(now));
                        }
                        Some(now)
                            if matches!(gate, Gate::IfMatch(expected) if expected < now.version)
                                && transition.is_own_change_retried(&now, by) =>
                        {
                            return Ok(TransitionOutcome::AlreadyDone(now));
                        }
                        // Someone else's version: the client's 412 under `If-Match`;
                        // without, decide again on it.
                        Some(now) if matches!(gate, Gate::IfMatch(_)) => {
                            return Ok(TransitionOutcome::VersionConflict(now));
                        }
                        Some(_) => false,
                    }
                }
                // Another transaction holds the token or the record: read both again
                // after a pause (a version that moved is then the client's 412).
                GatedWrite::Conflict => false,
            };
            match backoff.next_delay(started.elapsed()) {
                Some(delay) => tokio::time::sleep(delay).await,
                // A majority that never showed the change in the way: retry later (503),
                // as for an outage; neither a refusal nor a conflict could be told.
                None if lagging => {
                    return Err(StoreError::unavailable(
                        "the token's last change is not the majority's yet",
                    ));
                }
                None => return Ok(TransitionOutcome::Contended(current)),
            }
        }
    }
}

/// Whether a provider's withdrawal revoked `token` (its last author is a provider).
fn was_withdrawn(token: &TokenDoc) -> bool {
    token
        .last_changed_by
        .as_ref()
        .is_some_and(|author| Actor::from_stored(author.clone()).is_provider())
}

fn record_rejection(transition: &Transition) {
    metrics::counter!(
        metric::VERSION_GATE_REJECTIONS_TOTAL,
        "collection" => TOKENS,
        "operation" => transition.operation(),
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use mongodb::bson::oid::ObjectId;

    use super::*;

    /// What a row expects `decide` to answer; for a write, the fields it sets besides
    /// `updatedAt` and `lastChangedBy`, which every write carries.
    enum Expected {
        Write(Document),
        AlreadyDone,
        Forbidden,
    }

    #[test]
    fn decide_answers_every_status_and_transition_pair() {
        use Expected::{AlreadyDone, Forbidden, Write};
        use TokenStatus::{Active, Redeemed, Revoked};
        let now = DateTime::from_millis(1_700_000_000_000);
        let by = Actor::api_key("ops");
        let owner = Owner::from_object_id(ObjectId::new());
        // The token's owner in the table: not the transfer's new one.
        let holder = ObjectId::new();
        let redeem = |reference: Option<&str>| Transition::Redeem {
            reference: reference.map(str::to_owned),
        };
        let revoke = |reason: Option<&str>| Transition::Revoke {
            reason: reason.map(str::to_owned),
        };
        let transfer = Transition::Transfer { new_owner: owner };
        let table = [
            (
                Active,
                redeem(Some("order-7")),
                Write(doc! {
                    "status": "redeemed", "redeemedAt": now, "redemptionRef": "order-7",
                }),
            ),
            (
                Active,
                redeem(None),
                Write(doc! { "status": "redeemed", "redeemedAt": now }),
            ),
            (
                Active,
                revoke(Some("fraud")),
                Write(doc! {
                    "status": "revoked", "revokedAt": now, "revocationReason": "fraud",
                }),
            ),
            (
                Active,
                revoke(None),
                Write(doc! { "status": "revoked", "revokedAt": now }),
            ),
            // A transfer keeps the status and marks the owner as changed on purpose.
            (
                Active,
                transfer.clone(),
                Write(doc! { "owner": owner.object_id(), "transferredAt": now }),
            ),
            // A redeemed token is spent: nothing changes it any more.
            (Redeemed, redeem(Some("order-7")), Forbidden),
            (Redeemed, revoke(None), Forbidden),
            (Redeemed, transfer.clone(), Forbidden),
            // Revoking again is what the client asked for already; nothing else applies.
            (Revoked, revoke(Some("fraud")), AlreadyDone),
            (Revoked, redeem(None), Forbidden),
            (Revoked, transfer.clone(), Forbidden),
        ];

        let mut covered = HashSet::new();
        for (status, transition, expected) in &table {
            covered.insert((status.as_str(), transition.operation()));
            let row = format!("{status:?} × {transition:?}");
            match (
                decide(*status, false, holder, transition, &by, now),
                expected,
            ) {
                (Decision::Write(set), Write(fields)) => {
                    let mut want = doc! { "updatedAt": now, "lastChangedBy": "key:ops" };
                    want.extend(fields.clone());
                    assert_eq!(set, want, "{row}");
                }
                (Decision::AlreadyDone, AlreadyDone) | (Decision::Forbidden, Forbidden) => {}
                (Decision::Write(set), _) => panic!("{row}: wrote {set}"),
                (Decision::AlreadyDone, _) => panic!("{row}: answered already done"),
                (Decision::Forbidden, _) => panic!("{row}: answered forbidden"),
            }
        }
        assert_eq!(
            covered.len(),
            3 * 3,
            "the table names every (status, transition) pair"
        );

        // A token a withdrawal revoked: an operator's revoke makes it theirs (written),
        // the provider's own is done already, and nothing else applies still.
        match decide(Revoked, true, holder, &revoke(Some("fraud")), &by, now) {
            Decision::Write(set) => assert_eq!(
                set,
                doc! { "updatedAt": now, "lastChangedBy": "key:ops", "revocationReason": "fraud" }
            ),
            _ => panic!("an operator's revoke of a withdrawn token writes its author"),
        }
        let stripe = Actor::provider(&crate::domain::Provider::parse("stripe").unwrap());
        assert!(matches!(
            decide(Revoked, true, holder, &revoke(None), &stripe, now),
            Decision::AlreadyDone
        ));
        assert!(matches!(
            decide(Revoked, true, holder, &redeem(None), &by, now),
            Decision::Forbidden
        ));
        // A transfer to the owner the token has is done already.
        assert!(matches!(
            decide(Active, false, owner.object_id(), &transfer, &by, now),
            Decision::AlreadyDone
        ));
    }

    #[test]
    fn only_a_redeem_with_the_tokens_own_reference_is_a_replay() {
        let now = DateTime::from_millis(1_700_000_000_000);
        let token = |status, redemption_ref: Option<&str>| TokenDoc {
            id: ObjectId::new(),
            owner: ObjectId::new(),
            token_type: "standard".to_owned(),
            token_index: 0,
            origin: crate::store::Origin {
                provider: "stripe".to_owned(),
                account_id: "acct_1".to_owned(),
                payment_intent_id: "pi_1".to_owned(),
                date: now,
            },
            status,
            version: 1,
            created_at: now,
            updated_at: now,
            redeemed_at: None,
            redemption_ref: redemption_ref.map(str::to_owned),
            revoked_at: None,
            revocation_reason: None,
            last_changed_by: None,
        };
        let redeem = |reference: Option<&str>| Transition::Redeem {
            reference: reference.map(str::to_owned),
        };
        let redeemed = token(TokenStatus::Redeemed, Some("order-7"));
        assert!(redeem(Some("order-7")).is_replayed_by(&redeemed));
        assert!(!redeem(Some("order-8")).is_replayed_by(&redeemed));
        assert!(!redeem(None).is_replayed_by(&redeemed));
        assert!(!redeem(Some("")).is_replayed_by(&token(TokenStatus::Redeemed, Some(""))));
        assert!(!redeem(None).is_replayed_by(&token(TokenStatus::Redeemed, None)));
        // A revoked token that was never redeemed is no replay, whatever it carries.
        assert!(
            !redeem(Some("order-7")).is_replayed_by(&token(TokenStatus::Revoked, Some("order-7")))
        );
        let revoke = Transition::Revoke { reason: None };
        assert!(!revoke.is_replayed_by(&redeemed));
    }
}
