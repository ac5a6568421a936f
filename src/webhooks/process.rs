//! What a verified event does. Every effect is idempotent and derived from the payment's
//! state after the version-gated projection, so duplicates, concurrent deliveries and a
//! provider's retry after a crash all converge on one outcome:
//! - the event is current and the payment succeeded → issue the tokens its metadata names
//!   (the same store path as `POST /v1/issuances`), fulfilling a pending issuance;
//! - refunded or canceled → revoke the payment's active tokens, keep redeemed ones;
//! - older than the stored state → nothing (the newer event carries the effect).
//!
//! The event is recorded in `webhook_events` only after its effects, so nothing the
//! provider was told is done can be lost.

use chrono::Utc;

use super::{ParsedEvent, PaymentEvent};
use crate::domain::{IssuanceMode, NewIssuance, PaymentStatus};
use crate::store::{EventOutcome, IssueOutcome, PaymentDoc, Store, StoreError};

/// The outcome of one delivery; `duplicate` when the event was processed before.
pub struct Processed {
    pub duplicate: bool,
    pub outcome: EventOutcome,
}

/// Processes a verified event from `provider`.
pub async fn process(
    store: &Store,
    provider: &str,
    event: &ParsedEvent,
    default_mode: IssuanceMode,
) -> Result<Processed, StoreError> {
    if store.webhook_event_seen(provider, event.event_id()).await? {
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
            let state = store.project_payment(payment).await?;
            let outcome = if state.version > payment.version {
                EventOutcome::with_detail(
                    "stale",
                    format!("payment is already at version {}", state.version),
                )
            } else {
                apply_effects(store, payment, &state, default_mode).await?
            };
            (
                outcome,
                Some((
                    payment.key.account_id.as_str(),
                    payment.key.payment_intent_id.as_str(),
                )),
            )
        }
    };
    store
        .record_webhook_event(
            provider,
            event.event_id(),
            event.event_type(),
            payment,
            &outcome,
        )
        .await?;
    metrics::counter!("tokenmint_webhook_events_total", "provider" => provider.to_owned(), "outcome" => outcome.outcome.clone())
        .increment(1);
    Ok(Processed {
        duplicate: false,
        outcome,
    })
}

async fn apply_effects(
    store: &Store,
    event: &PaymentEvent,
    state: &PaymentDoc,
    default_mode: IssuanceMode,
) -> Result<EventOutcome, StoreError> {
    match state.status {
        PaymentStatus::Succeeded => issue(store, event, state, default_mode).await,
        PaymentStatus::Refunded | PaymentStatus::Canceled => {
            let reason = state.status.as_str();
            let (revoked, kept) = store.revoke_payment_tokens(&event.key, reason).await?;
            Ok(EventOutcome {
                tokens_revoked: Some(revoked),
                tokens_redeemed_kept: Some(kept),
                ..EventOutcome::new("revoked")
            })
        }
        PaymentStatus::Processing | PaymentStatus::Failed => Ok(EventOutcome::new("recorded")),
    }
}

async fn issue(
    store: &Store,
    event: &PaymentEvent,
    state: &PaymentDoc,
    default_mode: IssuanceMode,
) -> Result<EventOutcome, StoreError> {
    if let Some(reason) = &state.metadata_error {
        // Answered 200 all the same: the provider would retry a bad payload forever.
        tracing::warn!(payment = %event.key.payment_intent_id, event = %event.event_id, %reason, "succeeded payment has invalid token metadata");
        return Ok(EventOutcome::with_detail(
            "metadata_invalid",
            reason.as_str(),
        ));
    }
    let Some(params) = state.token_params.as_ref().and_then(|p| p.params()) else {
        return Ok(EventOutcome::with_detail(
            "no_metadata",
            "the payment names no tokens",
        ));
    };
    let request = NewIssuance {
        key: event.key.clone(),
        params,
        payment_date: event.payment_date.unwrap_or_else(Utc::now),
        mode: default_mode,
    };
    let outcome = match store.issue(&request).await? {
        IssueOutcome::Created(issued) => EventOutcome {
            tokens_created: Some(issued.created),
            ..EventOutcome::new("issued")
        },
        IssueOutcome::Replayed(issued) => EventOutcome {
            tokens_created: Some(issued.created),
            ..EventOutcome::new("already_issued")
        },
        IssueOutcome::Conflict(mismatches) => {
            let fields: Vec<&str> = mismatches.iter().map(|m| m.field.as_str()).collect();
            tracing::warn!(payment = %event.key.payment_intent_id, ?fields, "payment metadata conflicts with its issuance");
            EventOutcome::with_detail(
                "conflict",
                format!(
                    "metadata differs from the issuance in {}",
                    fields.join(", ")
                ),
            )
        }
        IssueOutcome::Pending(_) => EventOutcome::new("recorded"),
    };
    Ok(outcome)
}
