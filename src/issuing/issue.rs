//! Issuing a payment's tokens: who may, and the write path every issuer shares.
//!
//! The write path, in either mode: the record is claimed (its unique index decides the
//! payment's parameters), the tokens are written, the set is settled against the payment
//! and the record marked `issued`. A record is `issuing` until then (atomic mode commits
//! record and tokens together, `issued` unless the payment has a share to take back), so
//! a crash or a failed settle leaves an `issuing` record, which self-repair finishes the
//! same way. Group commit settles against the payments as it read them before writing,
//! which refunds' holds on the payment's place make safe (`store::placeholder`); the
//! one-request path here reads the payment again after writing.

use std::time::Duration;

use chrono::Utc;
use mongodb::bson::DateTime;

use super::standing::{share_written_revoked, takes_back, withdrawn};
use super::{Caller, IssueError, IssueOutcome, IssuedTokens, Issuer};
use crate::domain::{
    Actor, IssuanceMode, IssuanceParams, IssuanceStatus, NewIssuance, PaymentKey, PaymentStatus,
    TokenStatus,
};
use crate::store::{
    AtomicInsert, Existing, IssuanceDoc, PaymentDoc, StoreError, TokenSummary, retry,
};

/// How long after its creation a record found `unconfirmed` is left to its batch (whose
/// read takes milliseconds, and whose insert up to its patience with a record whose key a
/// killed instance's transaction holds), and how often a request waiting for it looks.
const UNCONFIRMED_WAIT: Duration = Duration::from_secs(1);
const UNCONFIRMED_POLL: Duration = Duration::from_millis(10);

impl Issuer {
    /// Issues `request` as `caller` may.
    pub async fn issue(
        &self,
        caller: Caller,
        request: &NewIssuance,
    ) -> Result<IssueOutcome, IssueError> {
        // Its record, pending or not; `issue_authorised` counts the tokens.
        self.writes.count(1);
        match caller {
            Caller::Trusted => self.issue_authorised(request).await,
            Caller::Checkout => self
                .request_from_checkout(request)
                .await
                .map_err(hide_mismatches),
        }
    }

    /// The trust flow of a checkout frontend: tokens are issued only when the provider has
    /// reported the payment succeeded with the same parameters; otherwise the request is
    /// recorded as pending, and the success event fulfils it.
    async fn request_from_checkout(
        &self,
        request: &NewIssuance,
    ) -> Result<IssueOutcome, IssueError> {
        if !self.may_name_provider(Caller::Checkout, &request.key.provider) {
            return Err(IssueError::UnknownProvider);
        }
        let payment = self.store.find_payment(&request.key).await?;
        refuse_unless_standing(payment.as_ref())?;
        match payment {
            Some(payment) if payment.status == PaymentStatus::Succeeded => {
                // Issued already (by a trusted backend, say): the record is what was
                // issued, and the checkout is answered from it, as it was before the
                // provider's success came. That success may name no parameters, or
                // others: it must not turn the same request's 200 into a 409.
                if self
                    .store
                    .find_record(&request.key)
                    .await?
                    .is_some_and(|record| record.status != IssuanceStatus::Pending)
                {
                    return self.record_pending(request).await;
                }
                let known = self.usable_metadata(&payment).ok().flatten().ok_or(
                    IssueError::NeedsTrustedIssuer(
                        "The payment succeeded without usable token metadata; only a trusted backend can issue for it.",
                    ),
                )?;
                refuse_other_params(&known, &request.params)?;
                // The provider's success authorises the issuance, so it is the provider's
                // request that is recorded (its author, date and the default mode), not
                // what the anonymous caller sent beside the matching parameters.
                let authorised = self.provider_request(&request.key, &payment, known, None);
                self.issue_authorised(&authorised).await
            }
            _ => self.record_pending(request).await,
        }
    }

    /// The token parameters the provider's metadata names, when it names valid ones that
    /// may be issued (`Ok(None)`: none); `Err`: they name more than the payment, as
    /// stored, pays for (`issuance.token_prices`), why. Metadata the customer may have
    /// written (Paddle's) is issued only once a success fixed it: the success is the event
    /// checked against what was paid (`Issuer::checked_metadata`), while parameters
    /// another event left on the payment (a declined attempt, whose checkout the browser
    /// then changed) were checked against nothing that was paid, and a success naming
    /// none would issue them. And whoever named them, they are checked again against the
    /// payment's money as it stands: the event that named them was checked against its
    /// own amount, which a later event may have changed (a success for less than the
    /// event before it said).
    pub(super) fn usable_metadata(
        &self,
        payment: &PaymentDoc,
    ) -> Result<Option<IssuanceParams>, String> {
        let customer_named = self.config.customer_metadata.contains(&payment.provider);
        let unchecked = customer_named && payment.token_params_fixed_by.is_none();
        if payment.metadata_error.is_some() || unchecked {
            return Ok(None);
        }
        let Some(params) = payment.token_params.as_ref().and_then(|p| p.params()) else {
            return Ok(None);
        };
        // The amount the money rule measures against: for a payment captured in parts,
        // what was authorised, which the tokens were asked for.
        let amount = payment.money().amount;
        match self.config.prices.unpaid(
            &params,
            amount,
            payment.currency.as_deref(),
            customer_named,
        ) {
            Some(unpaid) => Err(unpaid),
            None => Ok(Some(params)),
        }
    }

    /// The issuance a provider's report of `payment` vouches for: its `params`, its
    /// payment date (else `reported`, the event's, else now), the default mode, the
    /// provider as author. Whoever triggers it — the success event, or a checkout request
    /// that matches it — records these facts and nothing of its own.
    pub(super) fn provider_request(
        &self,
        key: &PaymentKey,
        payment: &PaymentDoc,
        params: IssuanceParams,
        reported: Option<chrono::DateTime<Utc>>,
    ) -> NewIssuance {
        NewIssuance {
            key: key.clone(),
            params,
            payment_date: payment
                .payment_date
                .map(crate::store::chrono_time)
                .or(reported)
                .unwrap_or_else(Utc::now),
            mode: self.config.default_mode,
            requested_by: Actor::provider(&key.provider),
        }
    }

    /// Records a checkout's request until the payment succeeds, unless the payment has a
    /// record already (then: verify it, and answer from it; this is also how a checkout
    /// is answered from a record issued before it asked). A refund's placeholder is
    /// taken over in place.
    async fn record_pending(&self, request: &NewIssuance) -> Result<IssueOutcome, IssueError> {
        let mut pending = IssuanceDoc::new(request, IssuanceStatus::Pending);
        pending.expires_at = Some(after(self.config.pending_ttl));
        let pending_answer = |issuance| {
            IssueOutcome::Pending(IssuedTokens {
                issuance,
                tokens: Vec::new(),
                created: 0,
            })
        };
        let mut attempt = 0;
        let existing = loop {
            match self.store.claim_record(&pending).await? {
                None => return Ok(pending_answer(pending)),
                Some(Existing::Record(record)) => {
                    if let Some(record) = self.once_confirmed(record).await? {
                        break record;
                    }
                }
                Some(Existing::Placeholder(id)) => {
                    if let Some(taken) = self.store.take_over_placeholder(id, &pending).await? {
                        return Ok(pending_answer(taken));
                    }
                }
            }
            // The placeholder expired or was taken over in between, or the record was
            // taken back: look again.
            attempt += 1;
            if !retry::RECORD_CHANGE.allows_another(attempt) {
                return Err(record_kept_changing());
            }
        };
        if existing.status == IssuanceStatus::Pending {
            // A checkout asked first (this one, or another, maybe with other parameters):
            // it decides nothing (only the provider's success, or a trusted backend, says
            // whose parameters are issued), so this request waits, answered with its own
            // parameters — neither refused, which would let anyone hold a payment's
            // checkout by asking first, nor told the first request's — and the pending
            // record's id and dates, so that every answer names the record a success
            // will fulfil, and answers again alike. The same for whoever asks, so that
            // no field tells whether a guess of the first request's parameters was right.
            let mut answer = pending.with_id(existing.id);
            answer.created_at = existing.created_at;
            answer.payment_date = existing.payment_date;
            answer.expires_at = existing.expires_at;
            return Ok(pending_answer(answer));
        }
        refuse_other_params(&existing.params()?, &request.params)?;
        Ok(IssueOutcome::Replayed(self.complete(existing).await?))
    }

    /// Issues `request`, which an authority vouched for: a trusted key, the provider's
    /// metadata, or a checkout request matching that metadata. Both modes go through group
    /// commit (upsert: shared commands; atomic: a shared transaction).
    pub(super) async fn issue_authorised(
        &self,
        request: &NewIssuance,
    ) -> Result<IssueOutcome, IssueError> {
        self.writes.count(u64::from(request.params.quantity.get()));
        self.committer().submit(request.clone()).await
    }

    /// Issues `request` on its own: refused if the payment is known not to stand, else
    /// the record claimed (or found), the tokens written or completed, the set settled and
    /// marked. The path of replays that group commit cannot answer from its reads.
    pub(super) async fn issue_alone(
        &self,
        request: &NewIssuance,
    ) -> Result<IssueOutcome, IssueError> {
        let payment = self.store.find_payment(&request.key).await?;
        refuse_unless_standing(payment.as_ref())?;
        let quantity = i64::from(request.params.quantity.get());
        let share = share_written_revoked(&request.key, quantity, payment.as_ref(), &[]);
        let mut attempt = 0;
        loop {
            // Atomic mode commits record and tokens together: the record is `issued` at
            // once, unless the payment has a share to take back, whose settle after the
            // commit must not be lost (`issuing` until it is done, as in upsert mode).
            let status = match (request.mode, &payment) {
                (IssuanceMode::Atomic, Some(payment)) if takes_back(payment) => {
                    IssuanceStatus::Issuing
                }
                (IssuanceMode::Atomic, _) => IssuanceStatus::Issued,
                (IssuanceMode::Upsert, _) => IssuanceStatus::Issuing,
            };
            let record = IssuanceDoc::new(request, status);
            let existing = match request.mode {
                IssuanceMode::Upsert => match self.store.claim_record(&record).await? {
                    None => {
                        let bulk = self.store.upsert_tokens(request, share.as_ref()).await?;
                        let created = bulk.inserted.len() as u32;
                        // When this request inserted every token, the reply names them all:
                        // no read-back. Otherwise a concurrent replay inserted some.
                        let tokens = if created == request.params.quantity.get() {
                            crate::store::fresh_tokens(bulk.inserted, share.as_ref())
                        } else {
                            self.store.payment_tokens(&request.key).await?
                        };
                        return self
                            .finish(record, tokens, created)
                            .await
                            .map(IssueOutcome::Created);
                    }
                    Some(existing) => Some(existing),
                },
                IssuanceMode::Atomic => match self
                    .store
                    .insert_atomically(&record, request, share.clone())
                    .await?
                {
                    AtomicInsert::Committed(tokens) => {
                        let created = tokens.len() as u32;
                        return self
                            .finish(record, tokens, created)
                            .await
                            .map(IssueOutcome::Created);
                    }
                    AtomicInsert::RecordExists(existing) => existing,
                },
            };
            // `None`: what took the place was gone when read (an expired pending record
            // or placeholder): look again.
            if let Some(existing) = existing
                && let Some(outcome) = self.answer_from_record(request, existing).await?
            {
                return Ok(outcome);
            }
            // Someone else took a pending record or a placeholder over, or it expired, in
            // between: look again.
            attempt += 1;
            if !retry::RECORD_CHANGE.allows_another(attempt) {
                // Tokens the majority has without a record are in the way for good (a
                // bug, or a hand-made document `verify` reports); otherwise the place is
                // taken by what the majority does not have yet, or kept changing.
                if !self.store.payment_tokens(&request.key).await?.is_empty() {
                    return Err(StoreError::Internal(
                        "the payment's tokens exist without their issuance record".to_owned(),
                    )
                    .into());
                }
                return Err(record_kept_changing());
            }
        }
    }

    /// Answers `request` from what takes the payment's place: a replay of its record
    /// (verified against the record, its set completed if short), or the take-over of a
    /// pending record or a refund's placeholder. `None` when a pending record or a
    /// placeholder changed under the take-over (the caller looks again).
    async fn answer_from_record(
        &self,
        request: &NewIssuance,
        existing: Existing,
    ) -> Result<Option<IssueOutcome>, IssueError> {
        let existing = match existing {
            Existing::Record(record) => match self.once_confirmed(record).await? {
                Some(record) => record,
                // Taken back by its batch: the place is free again, or a placeholder.
                None => return Ok(None),
            },
            // A refund came before any record, and the payment was standing when this
            // request read it (a partial refund, or a refund since): claimed in place,
            // then written and settled like a taken-over pending record.
            Existing::Placeholder(id) => {
                let record = IssuanceDoc::new(request, IssuanceStatus::Issuing);
                return match self.store.take_over_placeholder(id, &record).await? {
                    Some(taken) => self
                        .complete(taken)
                        .await
                        .map(|set| Some(IssueOutcome::Created(set))),
                    None => Ok(None),
                };
            }
        };
        if existing.status != IssuanceStatus::Pending {
            refuse_other_params(&existing.params()?, &request.params)?;
            return self
                .complete(existing)
                .await
                .map(|set| Some(IssueOutcome::Replayed(set)));
        }
        // A pending request carries no authority: the authorising request's record, all of
        // it, replaces whatever the checkout asked for.
        let record = IssuanceDoc::new(request, IssuanceStatus::Issuing);
        match self.store.take_over_pending(existing.id, &record).await? {
            Some(taken) => self
                .complete(taken)
                .await
                .map(|set| Some(IssueOutcome::Created(set))),
            None => Ok(None),
        }
    }

    /// `record` once its batch's read of the payment has decided it (see
    /// `IssuanceDoc::unconfirmed`): confirmed, or `None` when the batch took it back. A
    /// request that finds the record of a batch in flight waits for that read rather
    /// than confirming the record itself, which would keep a record the payment's state
    /// refuses (and its parameters would then answer the request, or refuse it). A
    /// record still unconfirmed `UNCONFIRMED_WAIT` after it was created belongs to a
    /// batch that failed, stalled or died: confirmed at once then, the caller having read
    /// the payment standing (a batch that was only slow answers its refused request 503
    /// instead of 409), or, for a repair, about to settle the set by a fresh read.
    pub(super) async fn once_confirmed(
        &self,
        record: IssuanceDoc,
    ) -> Result<Option<IssuanceDoc>, StoreError> {
        if !record.unconfirmed {
            return Ok(Some(record));
        }
        // From the record's creation, by the clock of the instance that wrote it: a
        // retry after a batch's failure (a whole batch of them, at worst, each holding
        // its writer) does not wait for a decision that is not coming. A clock ahead
        // of ours only makes the wait shorter, which costs a 503, not money.
        let age_ms = DateTime::now().timestamp_millis() - record.created_at.timestamp_millis();
        let age = Duration::from_millis(u64::try_from(age_ms).unwrap_or(0));
        let deadline = tokio::time::Instant::now() + UNCONFIRMED_WAIT.saturating_sub(age);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(UNCONFIRMED_POLL).await;
            match self.store.reread_record(&record).await? {
                Some(now) if now.unconfirmed => {}
                decided => return Ok(decided),
            }
        }
        self.store.confirm_record(&record).await
    }

    /// Answers from an existing (`issuing` or `issued`) record: completes its token set if
    /// it is short, and finishes it if it is not marked `issued` yet. A complete, issued
    /// set costs one read.
    pub(super) async fn complete(&self, record: IssuanceDoc) -> Result<IssuedTokens, IssueError> {
        // A batch's record whose payment read is still on the way (its own, whose read
        // said the payment stands, or one left by a batch that stalled or died):
        // confirmed before any token is written for it, so that the batch can no longer
        // take it back (a payment that does not stand is settled by `finish`'s fresh
        // read).
        let record = if record.unconfirmed {
            self.store
                .confirm_record(&record)
                .await?
                .ok_or_else(record_lost)?
        } else {
            record
        };
        let key = record.key()?;
        let held = self.store.payment_tokens_held(&key).await?;
        // Tokens written for another record of this payment, one a failover rolled back
        // after they had reached the new primary, are not this record's set: answering
        // them would issue more than it asks (a token past its quantity), or another
        // owner's or type's tokens (`verify`'s foreign tokens: a transfer alone gives a
        // token another owner). Refused, for an operator (`verify` reports them).
        let foreign = held.iter().any(|(token, holder)| {
            token.token_index >= record.quantity
                || holder.token_type != record.token_type
                || (holder.owner != Some(record.owner) && !holder.transferred)
        });
        if foreign {
            tracing::error!(
                payment = %crate::telemetry::Bounded(&record.payment_intent_id),
                issuance = %record.id,
                "the payment has tokens that are not its record's, written for a record that is gone; \
                 not answered from them"
            );
            return Err(StoreError::Internal(
                "the payment has tokens that are not its record's".to_owned(),
            )
            .into());
        }
        let mut tokens: Vec<TokenSummary> = held.into_iter().map(|(token, _)| token).collect();
        let mut created = 0;
        if tokens.len() < record.quantity as usize {
            // Completed with the recorded parameters (paymentDate included), not a retry's,
            // the share a refund known now takes back written revoked (`finish` settles
            // the rest by a read taken after the write).
            let payment = self.store.find_payment(&key).await?;
            // The share is counted past the tokens already spent, as a settle counts it.
            let spent: Vec<i64> = tokens
                .iter()
                .filter(|t| t.status == TokenStatus::Redeemed)
                .map(|t| t.token_index)
                .collect();
            let share = share_written_revoked(&key, record.quantity, payment.as_ref(), &spent);
            created = self
                .store
                .upsert_tokens(&record.token_set()?, share.as_ref())
                .await?
                .inserted
                .len() as u32;
            tokens = self.store.payment_tokens(&key).await?;
        }
        if record.status == IssuanceStatus::Issued && created == 0 {
            return Ok(IssuedTokens {
                issuance: record,
                tokens,
                created,
            });
        }
        self.finish(record, tokens, created).await
    }

    /// The last steps of every token write: settle the tokens against the payment as it
    /// is now (a refund may have been recorded while they were written), then mark the
    /// record `issued`. A refunded or canceled payment answers `PaymentNotSucceeded`.
    async fn finish(
        &self,
        mut record: IssuanceDoc,
        mut tokens: Vec<TokenSummary>,
        created: u32,
    ) -> Result<IssuedTokens, IssueError> {
        let key = record.key()?;
        let settlement = self.settle(&key, record.quantity).await?;
        // The answer names the tokens as they are now: the settle changed some (tokens
        // written revoked by an older read may have come back).
        if settlement.revoked > 0 || settlement.reactivated > 0 {
            tokens = self.store.payment_tokens(&key).await?;
        }
        if record.status != IssuanceStatus::Issued {
            if !self.store.mark_issued(record.id).await? {
                // Gone: a failover rolled back its insert (a batch's records are
                // acknowledged by the primary alone, and an election may come before the
                // batch's majority mark covers them). The tokens just written make no
                // issuance.
                return Err(IssueError::Store(record_lost()));
            }
            record.status = IssuanceStatus::Issued;
        }
        if let Some(status) = settlement.withdrawn {
            return Err(IssueError::PaymentNotSucceeded(status));
        }
        Ok(IssuedTokens {
            issuance: record,
            tokens,
            created,
        })
    }
}

/// 409 `payment_not_succeeded` for a payment the provider reported failed, canceled or
/// refunded, whoever asks.
pub(super) fn refuse_unless_standing(payment: Option<&PaymentDoc>) -> Result<(), IssueError> {
    match withdrawn(payment) {
        Some(status) => Err(IssueError::PaymentNotSucceeded(status)),
        None => Ok(()),
    }
}

/// 409 `conflict` for a request whose parameters differ from those the payment already
/// has (its record's, or the provider's metadata): a payment issues one set, and a
/// request for another is no replay of it.
pub(super) fn refuse_other_params(
    recorded: &IssuanceParams,
    requested: &IssuanceParams,
) -> Result<(), IssueError> {
    let mismatches = recorded.mismatches(requested);
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(IssueError::Conflict(mismatches))
    }
}

/// A checkout key hears that its request conflicts, not where: the recorded values would
/// tell a public key who owns a payment's tokens, and even the names of the fields that
/// differ let anyone holding the key probe a payment's quantity and token type one guess
/// at a time. The trusted backend, which may read, is told both.
fn hide_mismatches(err: IssueError) -> IssueError {
    match err {
        IssueError::Conflict(_) => IssueError::Conflict(Vec::new()),
        other => other,
    }
}

/// An issuance record that vanished before it was marked `issued`: a failover rolled back
/// its insert (or, for an `unconfirmed` one, its batch took it back). Nothing is
/// acknowledged; a retry records it again and converges on the tokens.
pub(super) fn record_lost() -> StoreError {
    StoreError::unavailable("the issuance record was lost before it was marked")
}

/// A record (or placeholder) that changed under every attempt to claim or take it over,
/// or that kept taking the payment's place unseen by a majority read: a write the
/// majority does not have yet (its commit gave up waiting, the secondaries lag). Either
/// passes; the retry, later, is answered from what then holds the place.
fn record_kept_changing() -> IssueError {
    StoreError::unavailable("the issuance record kept changing, or is not the majority's yet")
        .into()
}

/// The BSON time `ttl` from now.
fn after(ttl: Duration) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + ttl.as_millis() as i64)
}
