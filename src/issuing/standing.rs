//! The money invariant: tokens are spendable exactly while their payment stands.
//!
//! A payment's state entitles it to all of its tokens, to all but a refunded share, or to
//! none. `settle` makes the tokens agree with that: it revokes the share's active
//! tokens, counted from the highest tokenIndex down past the spent ones
//! (`domain::share_taken`), and leaves redeemed ones redeemed (what no unspent token is
//! left for is the shortfall): a customer who spent the highest tokens before the refund
//! loses lower ones instead of keeping more than the money pays for.
//!
//! Why every interleaving ends right: a refund first records the payment's new state (the
//! version-gated projection), then holds the payment's place in `issuances`, then
//! settles. A writer of tokens reads the payment before it writes, writes the share that
//! read takes back already revoked, and settles against that read after writing; the hold
//! orders the two (`store::placeholder`): a hold before the writer's record leaves a
//! placeholder that stops it, a hold on an uncommitted atomic record waits for the commit
//! and then revokes, a hold on an `issuing` record marks it held so the writer settles
//! again with a fresh read, and a hold after the tokens sees them. A record stays
//! `issuing` until its set is written and settled, so a writer that dies or whose settle
//! fails leaves it to self-repair, which settles with a fresh read; a refund that dies
//! before its settle is redelivered by its provider, and the sweep of recent withdrawals
//! settles it meanwhile.

use crate::domain::{self, Actor, Entitlement, IssuanceStatus, PaymentKey, PaymentStatus};
use crate::store::{IssuanceDoc, PaymentDoc, RevokedShare, StoreError};
use crate::telemetry::metric;

use super::Issuer;

/// The entitlement of a payment of `quantity` tokens in `payment`'s state (the money
/// rule, `domain::entitlement`); a payment tokenmint knows nothing of stands.
pub fn entitlement(payment: Option<&PaymentDoc>, quantity: i64) -> Entitlement {
    payment.map_or(Entitlement::All, |p| {
        domain::entitlement(p.status, &p.money(), quantity)
    })
}

/// The tokens of a set of `quantity` for `key`'s payment to write revoked, by `payment`
/// as read before the write and the tokenIndexes of the set spent already (`spent`): the
/// share a settle would take back (`domain::share_taken`), which every later settle takes
/// back too, since spending only moves its boundary down. Written so, a refund known
/// before the tokens leaves none of its share active even for the moment between the
/// write and the settle that follows it (which still runs, for what a refund recorded
/// after the read, or a spend since, changes).
pub fn share_written_revoked(
    key: &PaymentKey,
    quantity: i64,
    payment: Option<&PaymentDoc>,
    spent: &[i64],
) -> Option<RevokedShare> {
    match entitlement(payment, quantity) {
        Entitlement::Keep { keep, reason } if keep < quantity => Some(RevokedShare {
            from: domain::share_taken(quantity, keep, spent).from,
            reason,
            // The provider's report takes them back, as it does in a settle.
            by: Actor::provider(&key.provider),
        }),
        _ => None,
    }
}

/// Whether `payment`'s state takes any tokens back: refunded, canceled, failed, or partly
/// refunded (the same payments `verify` and the sweeps look at).
pub fn takes_back(payment: &PaymentDoc) -> bool {
    withdrawn(Some(payment)).is_some() || payment.money().withdrawn() > 0
}

/// Whether a payment that is not `refunded` (nor canceled: that is the provider's word
/// too) has its whole amount withdrawn by its money, refunds its provider called full
/// among them: it is `refunded`, whatever a newer version says.
pub(super) fn withdrawn_whole(payment: &PaymentDoc) -> bool {
    let money = payment.money();
    matches!(
        payment.status,
        PaymentStatus::Processing | PaymentStatus::Succeeded | PaymentStatus::Failed
    ) && money.explains_refund()
        && !money.leaves_some()
}

/// Whether money that came back makes a payment refunded by its withdrawals stand
/// again: it is then `succeeded` once more, and can be issued. Never an authorisation
/// to be captured with no capture recorded yet (Adyen under manual capture, its refund
/// heard before its CAPTURE): a refund proves only that something was captured, not
/// what was authorised, and its capture, when it comes, decides.
pub(super) fn stands_again(payment: &PaymentDoc) -> bool {
    let awaiting_capture = payment.authorised_amount.is_some() && payment.captures.is_empty();
    let money = payment.money();
    payment.status == PaymentStatus::Refunded
        && !awaiting_capture
        && money.explains_refund()
        && money.leaves_some()
}

/// The payment's state when it is refunded, canceled or failed: none of its tokens stand.
/// The one place that says which states those are (`PaymentStatus::forbids_issuance`).
pub(super) fn withdrawn(payment: Option<&PaymentDoc>) -> Option<PaymentStatus> {
    payment.map(|p| p.status).filter(|s| s.forbids_issuance())
}

/// What settling did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Active tokens revoked now.
    pub revoked: u64,
    /// What of the refunded share no unspent token was left for (spent tokens stay
    /// redeemed).
    pub shortfall: u64,
    /// Tokens a withdrawal had revoked that stand again, and were made active.
    pub reactivated: u64,
    /// The payment is refunded, canceled or failed: none of its tokens stand.
    pub withdrawn: Option<PaymentStatus>,
}

/// The most passes of a settle both ways: each one follows a change a concurrent event
/// made meanwhile, and that event settles after recording it anyway.
const SETTLE_PASSES: usize = 4;

impl Issuer {
    /// Re-reads the payment and makes its tokens agree with its state.
    pub(super) async fn settle(
        &self,
        key: &PaymentKey,
        quantity: i64,
    ) -> Result<Settlement, StoreError> {
        let payment = self.store.find_payment(key).await?;
        self.settle_both_ways(key, quantity, payment.as_ref()).await
    }

    /// Makes a payment's tokens agree with `payment`, for the set `record` (as read)
    /// says it has. The quantity is the set's only once the record is no longer pending:
    /// a pending request's quantity is replaced when the provider's success takes it
    /// over, and it has no tokens yet, so there is nothing to settle — the take-over
    /// settles its own tokens after writing them. No record: no set, and any token there
    /// is an orphan, which a withdrawn payment revokes.
    pub(super) async fn settle_recorded(
        &self,
        key: &PaymentKey,
        record: Option<&IssuanceDoc>,
        payment: Option<&PaymentDoc>,
    ) -> Result<Settlement, StoreError> {
        match record {
            Some(record) if record.status == IssuanceStatus::Pending => Ok(Settlement {
                withdrawn: withdrawn(payment),
                ..Settlement::default()
            }),
            Some(record) => self.settle_both_ways(key, record.quantity, payment).await,
            None => self.settle_with(key, 0, payment).await,
        }
    }

    /// Makes a payment's tokens agree with `payment`, its state as just read, both ways:
    /// revokes what no longer stands, then makes active again what withdrawals revoked
    /// and stands again (money came back, or the payment succeeded again).
    ///
    /// Only for a fresh read: a group-commit batch's settle, which goes by a read taken
    /// before its writes, only revokes (`settle_with`). Even a fresh read may be older
    /// than a concurrent event's: a settle that changed anything reads the payment again
    /// and settles by that read, until a pass changes nothing. Why that converges: every
    /// event records the money before it settles, and settles by a read taken after
    /// recording; the last pass's read follows this settle's writes, so an event it does
    /// not show was recorded after them, and its own settle then finds these tokens.
    /// Tokens come back only while the payment is still as that read showed it
    /// (`Store::reactivate_tokens`): one recorded between the read and the write brings
    /// nothing back, and the next pass decides by a newer read.
    pub(super) async fn settle_both_ways(
        &self,
        key: &PaymentKey,
        quantity: i64,
        payment: Option<&PaymentDoc>,
    ) -> Result<Settlement, StoreError> {
        let by = Actor::provider(&key.provider);
        let mut fresh = None;
        let mut settled = Settlement::default();
        for _ in 0..SETTLE_PASSES {
            let state = fresh.as_ref().or(payment);
            let pass = self.settle_with(key, quantity, state).await?;
            // Tokens come back only by a read taken now: the caller's (an event's, or a
            // sweep's listing from minutes ago) may predate a withdrawal whose own settle
            // already ran and found nothing to take back. Revoking by an older read is
            // undone by this one; bringing back by it would not be.
            fresh = self.store.find_payment(key).await?;
            let keep = entitlement(fresh.as_ref(), quantity).kept(quantity);
            // Gated on this read: if the payment moved since (a withdrawal recorded in
            // between), nothing comes back and the next pass decides by a newer read. No
            // payment: no settle ever revoked a token of it (it stands).
            let (reactivated, moved) = match fresh.as_ref() {
                Some(read) if keep > 0 => {
                    match self
                        .store
                        .reactivate_tokens(read, quantity, keep, &by)
                        .await?
                    {
                        Some(reactivated) => (reactivated, false),
                        None => (0, true),
                    }
                }
                _ => (0, false),
            };
            if reactivated > 0 {
                metrics::counter!(metric::TOKENS_REACTIVATED_TOTAL).increment(reactivated);
            }
            settled = Settlement {
                revoked: settled.revoked + pass.revoked,
                reactivated: settled.reactivated + reactivated,
                ..pass
            };
            if pass.revoked == 0 && reactivated == 0 && !moved {
                break;
            }
        }
        Ok(settled)
    }

    /// Makes a payment's tokens agree with `payment` (its state as just read).
    pub(super) async fn settle_with(
        &self,
        key: &PaymentKey,
        quantity: i64,
        payment: Option<&PaymentDoc>,
    ) -> Result<Settlement, StoreError> {
        let withdrawn = withdrawn(payment);
        match entitlement(payment, quantity) {
            Entitlement::All => Ok(Settlement {
                withdrawn,
                ..Settlement::default()
            }),
            Entitlement::Keep { keep, reason } => {
                // Whoever runs the settlement, the provider's report is what takes the
                // tokens back: it is the author on record.
                let by = Actor::provider(&key.provider);
                let (revoked, shortfall) = self
                    .store
                    .revoke_share(key, quantity, keep, reason, &by)
                    .await?;
                if revoked > 0 {
                    metrics::counter!(metric::TOKENS_REVOKED_TOTAL, "reason" => reason.as_str())
                        .increment(revoked);
                }
                Ok(Settlement {
                    revoked,
                    shortfall,
                    withdrawn,
                    ..Settlement::default()
                })
            }
        }
    }
}
