//! What a verified provider event does. The event is first folded into the payment's
//! state (the version-gated projection); the effects are then derived from that state,
//! not from the event, so they are idempotent and order-free: duplicates, concurrent
//! deliveries, out-of-order events and a provider's retry after a crash all converge.
//! - succeeded → issue the tokens its metadata names (taking over a pending checkout
//!   request), then settle any partial refund;
//! - refunded, canceled, or a partial refund → settle: revoke what no longer stands;
//! - failed → recorded, and settled like a withdrawal: a payment whose money failed
//!   after its success (a capture the card scheme rejected) keeps no token;
//! - processing → recorded only.
//!
//! Two rules hold whatever the versions say, so that a correctly signed event replayed
//! with unsigned fields changed (a later date, other metadata) after its dedupe record
//! expired does nothing ([`gate`]): canceled and refunded are terminal (a payment the
//! provider took back never stands again; a failed one may, a customer can retry it),
//! and the first success event that names valid token parameters fixes them. An event
//! that would break either is held back whole — outcome `terminal` or
//! `metadata_conflict`, no effect derived — and recorded like any other.
//!
//! A refund or chargeback is first recorded under its own id among the payment's
//! refunds, whose sum is the refunded amount: whether it is partial (the payment still
//! stands) or full (projected as `refunded`) is decided here, from the provider's word and
//! the amounts (refunds adding up to the whole amount are full, whatever each was
//! called), so a refund replayed under any event id counts once.
//!
//! Money that comes back (a dispute won, a failed refund, a chargeback reversed) is
//! recorded the same way, under its own id among the payment's reversals, and settles
//! both ways: the tokens withdrawals revoked and the payment stands for again become
//! active (`apply_reversal`).
//!
//! The event is recorded in `webhook_events` only after its effects, so nothing the
//! provider was told is done can be lost.

use super::standing::{stands_again, takes_back, withdrawn_whole};
use super::{IssueError, IssueOutcome, Issuer, Settlement};
use crate::domain::{EventOutcome, ParsedEvent, PaymentEvent, PaymentStatus, Reversal};
use crate::store::{PaymentDoc, ProjectionGate, StoreError, retry};
use crate::telemetry::{Bounded, metric};

/// What the event being applied withdraws, as its caller judged it: a refund read as
/// all of the payment may make it `refunded` by its money; anything else only brings it
/// back when money came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Withdraws {
    Whole,
    Part,
}

/// The outcome of one delivery; `duplicate` when the event was processed before.
pub struct Processed {
    pub duplicate: bool,
    pub outcome: EventOutcome,
}

impl Issuer {
    /// Processes a verified event from `provider`.
    pub async fn apply_event(
        &self,
        provider: &str,
        event: &ParsedEvent,
    ) -> Result<Processed, StoreError> {
        // Its record and the payment's; the tokens of an issuance it starts are counted
        // by `issue_authorised`.
        self.writes.count(2);
        if self
            .store
            .webhook_event_seen(provider, event.event_id())
            .await?
        {
            return Ok(Processed {
                duplicate: true,
                outcome: EventOutcome::new("duplicate"),
            });
        }
        let (outcome, payment) = match event {
            ParsedEvent::Ignored { reason, .. } => {
                (EventOutcome::with_detail("ignored", reason.as_str()), None)
            }
            ParsedEvent::Payment(payment) => {
                let outcome = self.apply_payment_event(payment).await?;
                (
                    outcome,
                    Some((
                        payment.key.account_id.as_str(),
                        payment.key.payment_intent_id.as_str(),
                    )),
                )
            }
        };
        self.store
            .record_webhook_event(
                provider,
                event.event_id(),
                event.event_type(),
                payment,
                &outcome,
            )
            .await?;
        metrics::counter!(metric::WEBHOOK_EVENTS_TOTAL, "provider" => provider.to_owned(), "outcome" => outcome.outcome.clone())
            .increment(1);
        Ok(Processed {
            duplicate: false,
            outcome,
        })
    }

    async fn apply_payment_event(&self, event: &PaymentEvent) -> Result<EventOutcome, StoreError> {
        let checked = self.checked_metadata(event);
        let event = checked.as_ref().unwrap_or(event);
        if let Some(reversal) = &event.reversal {
            return self.apply_reversal(event, reversal).await;
        }
        if let Some(state) = self.record_partial_refund(event).await? {
            // The status may still say `refunded` for money that came back since: this
            // refund's own first delivery projected it, and failed before it moved the
            // status back (its redelivery, here, finds the refund already counted). It
            // withdraws less than the whole, so it never makes the payment `refunded`.
            let state = self.status_by_money(event, state, Withdraws::Part).await?;
            let mut outcome = self.apply_state(event, &state).await?;
            if outcome.outcome != "conflict" {
                outcome.outcome = "revoked".to_owned();
            }
            return Ok(outcome);
        }
        // Money an event reports never taken is recorded as taken back first, under its
        // own id (a replay counts once), whatever else the event carries or becomes of
        // it: what a success captured in part left (so that no state without it is ever
        // derived from this success: the issuance it starts writes that share revoked),
        // or what a capture the scheme rejected was to take.
        if let Some(released) = &event.uncaptured {
            let amount = released.amount.unwrap_or(0);
            self.store
                .record_refund(&event.key, released, amount, event.amount)
                .await?;
        }
        let gate = gate(event);
        let state = self.store.project_payment(event, gate).await?;
        if let Some(mut refused) = held_back(event, &gate, &state) {
            tracing::warn!(payment = %Bounded(event.key.payment_intent_id.as_str()), event = %Bounded(&event.event_id), outcome = %refused.outcome, "provider event held back");
            // Nothing else of the payment changed, so there are no other effects to
            // derive (settling again could only write a placeholder for an event that did
            // nothing); but money it reports taken back is taken back all the same.
            if event.uncaptured.is_some() {
                let record = self.store.hold_place(&event.key).await?;
                let settlement = self
                    .settle_recorded(&event.key, record.as_ref(), Some(&state))
                    .await?;
                add_settlement(&mut refused, settlement);
            }
            return Ok(refused);
        }
        let withdraws = if event.refund.is_some() {
            Withdraws::Whole
        } else {
            Withdraws::Part
        };
        let state = self.status_by_money(event, state, withdraws).await?;
        let mut outcome = self.apply_state(event, &state).await?;
        // A failure that took tokens back (a capture rejected after the payment was
        // reported paid) is a withdrawal too.
        let failure_took_back = event.status == PaymentStatus::Failed
            && state.status == PaymentStatus::Failed
            && outcome.tokens_revoked.unwrap_or(0) > 0;
        let refund = event.status == PaymentStatus::Refunded && outcome.outcome != "conflict";
        if refund || failure_took_back {
            outcome.outcome = "revoked".to_owned();
        } else if state.version > event.version && outcome.tokens_created.unwrap_or(0) == 0 {
            // Older than what is known. Its effects, re-derived from the current state,
            // may still change tokens: money it records apart from the state (a release
            // of what was not captured, a capture part delivered after a later one), or
            // a settle a newer event left undone. Such an event says what it did; one
            // that changed nothing carried no news.
            let detail = format!("payment is already at version {}", state.version);
            if outcome.tokens_revoked.unwrap_or(0) > 0 {
                outcome.outcome = "revoked".to_owned();
                outcome.detail = Some(detail);
            } else if outcome.tokens_reactivated.unwrap_or(0) == 0 {
                outcome = EventOutcome::with_detail("stale", detail);
            }
        }
        Ok(outcome)
    }

    /// `event` with its metadata read as invalid when the payment it reports does not pay
    /// for the tokens the metadata names, so that it issues nothing, fixes nothing, and
    /// says why (`metadata_invalid`); `None` when the event is taken as it is. Paid for
    /// means both: its amount covers the tokens at their prices (`issuance.token_prices`),
    /// and, where the provider sells tokens in packs, its items bought them (a renewal or
    /// another product in the cart pays, but buys none).
    fn checked_metadata(&self, event: &PaymentEvent) -> Option<PaymentEvent> {
        let Some(Ok(params)) = &event.token_params else {
            return None;
        };
        let reason = self
            .config
            .prices
            .unpaid(
                params,
                event.amount,
                event.currency.as_deref(),
                event.customer_metadata,
            )
            .or_else(|| event.bought.as_ref()?.short_of(params))?;
        Some(PaymentEvent {
            token_params: Some(Err(reason)),
            ..event.clone()
        })
    }

    /// Records a refund event's amount among the payment's refunds (keyed by the
    /// refund's id, so a replay counts once) and returns the payment's state when the
    /// refunds leave it standing: a partial refund, after which only the refunded share
    /// is taken back. `None` for any other event, and for a refund of everything, which
    /// the caller projects as the payment's new state.
    ///
    /// A refund is full when the provider says so, or when all the refunds so far add up
    /// to the payment's whole amount, whatever the provider called each one: two halves
    /// refund the payment. Otherwise it is partial when the refunds add up to less than
    /// the amount, or, the amount not known yet, when the provider says so. A refund of
    /// an unknown share (no amount, or the payment's amount unknown and no word from the
    /// provider) can only be read as a full one.
    async fn record_partial_refund(
        &self,
        event: &PaymentEvent,
    ) -> Result<Option<PaymentDoc>, StoreError> {
        let (PaymentStatus::Refunded, Some(refund)) = (event.status, &event.refund) else {
            return Ok(None);
        };
        // A full refund of no amount is kept too, as a full withdrawal of nothing: it
        // counts as the payment's amount, so the status it sets is the money's to undo.
        let refund_amount = match (refund.amount, refund.full) {
            (Some(amount), _) => amount,
            (None, Some(true)) => 0,
            (None, _) => return Ok(None),
        };
        let state = self
            .store
            .record_refund(&event.key, refund, refund_amount, event.amount)
            .await?;
        // What is taken back for good, reversals counted: a full withdrawal that came
        // back (a chargeback reversed, then replayed) leaves the payment standing.
        let money = state.money();
        let partial = match money.amount {
            Some(amount) if amount > 0 => money.withdrawn() < amount,
            _ => refund.full == Some(false),
        };
        Ok(partial.then_some(state))
    }

    /// Money came back (a dispute won, a refund that failed, a chargeback reversed): the
    /// reversal is recorded under its own id, so it counts once however often and in
    /// whatever order it arrives, a payment refunded by its money stands again
    /// (`succeeded`) when some came back, and the tokens withdrawals revoked that the
    /// payment is entitled to again are made active (`tokensReactivated`). A reversal
    /// before the withdrawal it names waits for it (`domain::Money`): recorded now, it
    /// is what that withdrawal's settle finds. A payment standing again is issued like
    /// after its success (a checkout's pending request is fulfilled), then settled.
    async fn apply_reversal(
        &self,
        event: &PaymentEvent,
        reversal: &Reversal,
    ) -> Result<EventOutcome, StoreError> {
        let state = self.store.record_reversal(&event.key, reversal).await?;
        let state = self.status_by_money(event, state, Withdraws::Part).await?;
        let mut outcome = self.apply_state(event, &state).await?;
        // Always answered, 0 included: what a reversal did is how many came back.
        outcome.tokens_reactivated = Some(outcome.tokens_reactivated.unwrap_or(0));
        if outcome.outcome != "conflict" {
            outcome.outcome = "reinstated".to_owned();
        }
        Ok(outcome)
    }

    /// Makes the payment's status say what its money says, where the versions could
    /// not: a payment refunded by its money moves back to `succeeded` when money came
    /// back (`stands_again`), and one whose money is withdrawn whole by a refund that
    /// lost to a newer version (a reversal had reopened it meanwhile) is `refunded`
    /// again (`withdrawn_whole`, only for a refund the caller judged whole). Each event decides on the document as it read it after
    /// writing its money, and the move is gated on that read's status, version and money:
    /// when another event changed any of them meanwhile, the move does nothing and the
    /// decision is taken again on the document as it now is. Returns that state.
    async fn status_by_money(
        &self,
        event: &PaymentEvent,
        mut state: PaymentDoc,
        withdraws: Withdraws,
    ) -> Result<PaymentDoc, StoreError> {
        let decide = |state: &PaymentDoc| {
            if stands_again(state) {
                Some(PaymentStatus::Succeeded)
            } else if withdraws == Withdraws::Whole && withdrawn_whole(state) {
                Some(PaymentStatus::Refunded)
            } else {
                None
            }
        };
        for _ in 0..retry::PAYMENT_STATUS.max_attempts {
            let Some(to) = decide(&state) else {
                return Ok(state);
            };
            match self.store.move_status(&state, to, event).await? {
                Some(now) if now.status == to => return Ok(now),
                Some(now) => state = now,
                None => return Ok(state),
            }
        }
        // Still to move after every attempt lost to another write: answering now would
        // leave a status the money contradicts, and nothing later moves it. An error
        // makes the provider deliver again, and the redelivery decides afresh.
        match decide(&state) {
            None => Ok(state),
            Some(_) => Err(StoreError::Internal(
                "the payment kept changing while its status was moved by its money".to_owned(),
            )),
        }
    }

    /// The effects the payment's state calls for.
    async fn apply_state(
        &self,
        event: &PaymentEvent,
        state: &PaymentDoc,
    ) -> Result<EventOutcome, StoreError> {
        let mut outcome = match state.status {
            PaymentStatus::Succeeded => self.issue_from_metadata(event, state).await?,
            _ => EventOutcome::new("recorded"),
        };
        // Settle against the state just projected: a refund, partial refund or
        // cancellation revokes what no longer stands (nothing, when the payment stands).
        // The record is read after the issuance above, which may have created it or
        // replaced a pending request's quantity with the provider's: the share is taken
        // of the quantity the payment has now. A state that takes tokens back holds the
        // payment's place instead of only reading it: that orders this settle after any
        // atomic issuance in flight, or stops the issuance (see `store::placeholder`).
        // So does money coming back: an issuance in flight settles by a read taken before
        // its writes, which may not show the reversal, and could revoke after this
        // settle; held, its record is settled again with a fresh read.
        let record = if takes_back(state) || event.reversal.is_some() {
            self.store.hold_place(&event.key).await?
        } else {
            self.store.find_record(&event.key).await?
        };
        let settlement = self
            .settle_recorded(&event.key, record.as_ref(), Some(state))
            .await?;
        add_settlement(&mut outcome, settlement);
        Ok(outcome)
    }

    /// Issues the tokens a succeeded payment's metadata names, through the same path as
    /// a trusted `POST /v1/issuances`.
    async fn issue_from_metadata(
        &self,
        event: &PaymentEvent,
        state: &PaymentDoc,
    ) -> Result<EventOutcome, StoreError> {
        if let Some(reason) = &state.metadata_error {
            // Answered 200 all the same: the provider would retry a bad payload forever.
            tracing::warn!(payment = %Bounded(event.key.payment_intent_id.as_str()), event = %Bounded(&event.event_id), %reason, "succeeded payment has invalid token metadata");
            return Ok(EventOutcome::with_detail(
                "metadata_invalid",
                reason.as_str(),
            ));
        }
        let params = match self.usable_metadata(state) {
            Ok(Some(params)) => params,
            Ok(None) => {
                return Ok(EventOutcome::with_detail(
                    "no_metadata",
                    "the payment names no tokens",
                ));
            }
            Err(unpaid) => {
                tracing::warn!(payment = %Bounded(event.key.payment_intent_id.as_str()), event = %Bounded(&event.event_id), reason = %unpaid, "succeeded payment's token metadata is not paid for");
                return Ok(EventOutcome::with_detail("metadata_invalid", unpaid));
            }
        };
        let request = self.provider_request(&event.key, state, params, event.payment_date);
        Ok(match self.issue_authorised(&request).await {
            Ok(IssueOutcome::Created(issued)) => EventOutcome {
                tokens_created: Some(issued.created),
                ..EventOutcome::new("issued")
            },
            Ok(IssueOutcome::Replayed(issued) | IssueOutcome::Pending(issued)) => EventOutcome {
                tokens_created: Some(issued.created),
                ..EventOutcome::new("already_issued")
            },
            Err(IssueError::Conflict(mismatches)) => {
                let fields: Vec<&str> = mismatches.iter().map(|m| m.field.as_str()).collect();
                tracing::warn!(payment = %Bounded(event.key.payment_intent_id.as_str()), ?fields, "payment metadata conflicts with its issuance");
                EventOutcome::with_detail(
                    "conflict",
                    format!(
                        "metadata differs from the issuance in {}",
                        fields.join(", ")
                    ),
                )
            }
            // Refunded or canceled while issuing: the tokens written are revoked already.
            Err(IssueError::PaymentNotSucceeded(status)) => {
                EventOutcome::with_detail("revoked", format!("the payment is {}", status.as_str()))
            }
            Err(IssueError::Store(err)) => return Err(err),
            Err(other) => return Err(StoreError::Internal(other.to_string())),
        })
    }
}

/// The stored statuses an event of `status` may move a payment on from. Canceled and
/// refunded are terminal: a payment the provider took back only moves on to being
/// refunded (both take every token back), whatever a later processing, failed or success
/// event's version says. Failed is not: a customer can retry the same payment.
fn moves_from(status: PaymentStatus) -> &'static [PaymentStatus] {
    use PaymentStatus::{Canceled, Failed, Processing, Refunded, Succeeded};
    match status {
        Refunded => &[Processing, Failed, Succeeded, Canceled, Refunded],
        Canceled => &[Processing, Failed, Succeeded, Canceled],
        Processing | Failed | Succeeded => &[Processing, Failed, Succeeded],
    }
}

/// The conditions under which `event` changes nothing, for the projection to execute.
/// Only a success (or an authorisation a capture will turn into one) fixes the payment's
/// parameters, with the first valid metadata it names.
/// A withdrawal (canceled, refunded) or a failure is never held back for its metadata:
/// taking tokens back must not depend on what else an event carries; its metadata is
/// simply not used.
fn gate(event: &PaymentEvent) -> ProjectionGate<'static> {
    ProjectionGate {
        moves_from: moves_from(event.status),
        fixes_params: event.fixes_params(),
        bound_to_fixed_params: !matches!(
            event.status,
            PaymentStatus::Canceled | PaymentStatus::Refunded | PaymentStatus::Failed
        ),
        // Where the customer may write the metadata (Paddle), a checkout may change
        // between attempts: its success says what was paid for what, over a declined
        // attempt's amount and metadata error. Elsewhere an amount once stored stays:
        // a later fact (an Adyen capture's sum) must not give way to an older event's.
        restates: event.customer_metadata,
        // A cancellation after a capture in part (Adyen's multiple partial captures)
        // releases the rest of the authorisation, which the money already counts as
        // withdrawn (`uncaptured:`): the captured money stands, and so do its tokens.
        yields_to_captures: event.status == PaymentStatus::Canceled,
    }
}

/// Why the projection held `event` back under `gate`, read from the state it returned:
/// a held-back event left the stored document as it was, and an applied one leaves a
/// state under which no condition holds (it has the event's version, the parameters it
/// fixed, and no capture when it is a cancellation), so the same conditions tell the two
/// apart.
fn held_back(
    event: &PaymentEvent,
    gate: &ProjectionGate<'_>,
    state: &PaymentDoc,
) -> Option<EventOutcome> {
    if state.version < event.version && !gate.moves_from.contains(&state.status) {
        return Some(EventOutcome::with_detail(
            "terminal",
            format!(
                "the payment is {}: a {} event cannot move it",
                state.status.as_str(),
                event.status.as_str()
            ),
        ));
    }
    if gate.yields_to_captures && !state.captures.is_empty() {
        return Some(EventOutcome::with_detail(
            "ignored",
            "the payment was captured in part: a cancellation releases only the rest, withdrawn already",
        ));
    }
    let fixed_by = state.token_params_fixed_by.as_deref()?;
    let named = event.token_params.as_ref()?;
    let fixed = state.token_params.as_ref().and_then(|p| p.params());
    // Invalid parameters name none: the same as none fixed (`names_other_params`).
    let same = match named {
        Ok(params) => fixed.as_ref() == Some(params),
        Err(_) => fixed.is_none(),
    };
    (gate.bound_to_fixed_params && !same).then(|| {
        EventOutcome::with_detail(
            "metadata_conflict",
            format!("the payment's token parameters were fixed by event {fixed_by}; this event names others"),
        )
    })
}

fn add_settlement(outcome: &mut EventOutcome, settlement: Settlement) {
    if settlement.revoked > 0 || settlement.shortfall > 0 || settlement.withdrawn.is_some() {
        outcome.tokens_revoked = Some(outcome.tokens_revoked.unwrap_or(0) + settlement.revoked);
        outcome.shortfall = Some(outcome.shortfall.unwrap_or(0) + settlement.shortfall);
    }
    if settlement.reactivated > 0 {
        outcome.tokens_reactivated =
            Some(outcome.tokens_reactivated.unwrap_or(0) + settlement.reactivated);
    }
}
