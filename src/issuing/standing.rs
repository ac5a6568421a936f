//! The money invariant: tokens are spendable exactly while their payment stands.
//!
//! A payment's state entitles it to all of its tokens, to all but a refunded share, or to
//! none. `settle` makes the tokens agree with that: it revokes the active tokens the
//! payment is no longer entitled to, highest tokenIndex first, and leaves redeemed ones
//! redeemed (they are the shortfall).
//!
//! Why every interleaving ends right: a refund first records the payment's new state
//! (the version-gated projection), then holds the payment's place in `issuances`, then
//! settles. A writer of tokens reads the payment before it writes and settles against
//! that read after writing; the hold orders the two (`store::placeholder`): a hold before
//! the writer's record leaves a placeholder that stops it, a hold on an uncommitted
//! atomic record waits for the commit and then revokes, a hold on an `issuing` record
//! marks it held so the writer settles again with a fresh read, and a hold after the
//! tokens sees them. A record stays `issuing` until its set is written and settled, so a
//! writer that dies or whose settle fails leaves it to self-repair, which settles with a
//! fresh read; a refund that dies before its settle is redelivered by its provider, and
//! the sweep of recent withdrawals settles it meanwhile.

use crate::domain::{Actor, IssuanceStatus, PaymentKey, PaymentStatus};
use crate::store::{IssuanceDoc, PaymentDoc, StoreError};
use crate::telemetry::metric;

use super::Issuer;

/// How many of its `quantity` tokens a payment is entitled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entitlement {
    /// Every token: the payment stands (or tokenmint knows nothing against it).
    All,
    /// Tokens 0..keep-1 only; the rest are the refunded share (`reason` says why).
    Keep { keep: i64, reason: &'static str },
}

/// The entitlement of a payment of `quantity` tokens in `payment`'s state.
///
/// A partial refund of `r` out of `a` takes back `floor(quantity × r ÷ a)` tokens; a
/// refund of unknown proportion (no amount known) takes back all of them, as a refund
/// the provider reported without an amount can only be read as a full one.
pub fn entitlement(payment: Option<&PaymentDoc>, quantity: i64) -> Entitlement {
    let Some(payment) = payment else {
        return Entitlement::All;
    };
    match payment.status {
        PaymentStatus::Refunded => Entitlement::Keep {
            keep: 0,
            reason: "refunded",
        },
        PaymentStatus::Canceled => Entitlement::Keep {
            keep: 0,
            reason: "canceled",
        },
        // Only reachable with tokens when the money failed after a success (Adyen's
        // CAPTURE_FAILED): none of them were paid for.
        PaymentStatus::Failed => Entitlement::Keep {
            keep: 0,
            reason: "failed",
        },
        PaymentStatus::Processing | PaymentStatus::Succeeded => {
            match (payment.amount_refunded, payment.amount) {
                (None | Some(0), _) => Entitlement::All,
                (Some(refunded), Some(amount)) if amount > 0 => {
                    let refunded = refunded.clamp(0, amount);
                    // i128: quantity × amount can exceed i64 for absurd amounts.
                    let share =
                        (i128::from(quantity) * i128::from(refunded) / i128::from(amount)) as i64;
                    if share == 0 {
                        Entitlement::All
                    } else {
                        Entitlement::Keep {
                            keep: quantity - share,
                            reason: "partial_refund",
                        }
                    }
                }
                (Some(_), _) => Entitlement::Keep {
                    keep: 0,
                    reason: "refunded",
                },
            }
        }
    }
}

/// Whether `payment`'s state takes any tokens back: refunded, canceled, failed, or partly
/// refunded (the same payments `verify` and the sweeps look at).
pub fn takes_back(payment: &PaymentDoc) -> bool {
    payment.status.forbids_issuance()
        || payment.amount_refunded.is_some_and(|refunded| refunded > 0)
}

/// The payment's state when it is refunded, canceled or failed: none of its tokens stand.
fn withdrawn(payment: Option<&PaymentDoc>) -> Option<PaymentStatus> {
    payment.map(|p| p.status).filter(|s| s.forbids_issuance())
}

/// What settling did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Active tokens revoked now.
    pub revoked: u64,
    /// Tokens of the refunded share that were already redeemed (they stay redeemed).
    pub shortfall: u64,
    /// The payment is refunded, canceled or failed: none of its tokens stand.
    pub withdrawn: Option<PaymentStatus>,
}

impl Issuer {
    /// Re-reads the payment and makes its tokens agree with its state.
    pub(super) async fn settle(
        &self,
        key: &PaymentKey,
        quantity: i64,
    ) -> Result<Settlement, StoreError> {
        let payment = self.store.find_payment(key).await?;
        self.settle_with(key, quantity, payment.as_ref()).await
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
            Some(record) => self.settle_with(key, record.quantity, payment).await,
            None => self.settle_with(key, 0, payment).await,
        }
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
                    .revoke_tokens_from(key, keep, reason, &by)
                    .await?;
                if revoked > 0 {
                    metrics::counter!(metric::TOKENS_REVOKED_TOTAL, "reason" => reason)
                        .increment(revoked);
                }
                Ok(Settlement {
                    revoked,
                    shortfall,
                    withdrawn,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use super::*;

    fn payment(status: PaymentStatus, amount: Option<i64>, refunded: Option<i64>) -> PaymentDoc {
        PaymentDoc {
            provider: "stripe".to_owned(),
            account_id: "default".to_owned(),
            payment_intent_id: "pi_1".to_owned(),
            status,
            version: 1,
            amount,
            currency: None,
            token_params: None,
            metadata_error: None,
            token_params_fixed_by: None,
            payment_date: None,
            amount_refunded: refunded,
            last_event_id: "evt".to_owned(),
            last_event_type: "t".to_owned(),
            created_at: DateTime::now(),
            updated_at: DateTime::now(),
        }
    }

    #[test]
    fn entitlement_follows_the_payment_state() {
        use PaymentStatus::*;
        const ALL: Entitlement = Entitlement::All;
        const fn keep(keep: i64, reason: &'static str) -> Entitlement {
            Entitlement::Keep { keep, reason }
        }
        // (status, amount, amount refunded, quantity) → entitlement; `None` as the state
        // is a payment tokenmint has heard nothing about.
        type Row = (
            Option<(PaymentStatus, Option<i64>, Option<i64>)>,
            i64,
            Entitlement,
        );
        let table: [Row; 19] = [
            // Nothing known against the payment: it stands.
            (None, 10, ALL),
            (Some((Succeeded, Some(1000), None)), 10, ALL),
            (Some((Processing, None, None)), 10, ALL),
            (Some((Failed, Some(1000), None)), 10, keep(0, "failed")),
            (Some((Succeeded, Some(1000), Some(0))), 10, ALL),
            // Withdrawn payments keep nothing, whatever the amounts say.
            (Some((Refunded, Some(1000), None)), 10, keep(0, "refunded")),
            (
                Some((Refunded, Some(1000), Some(10))),
                10,
                keep(0, "refunded"),
            ),
            (Some((Canceled, None, None)), 10, keep(0, "canceled")),
            (
                Some((Canceled, Some(1000), Some(1000))),
                1,
                keep(0, "canceled"),
            ),
            // 10 tokens, 250 of 1000 refunded: floor(2.5) = 2 taken back.
            (
                Some((Succeeded, Some(1000), Some(250))),
                10,
                keep(8, "partial_refund"),
            ),
            (
                Some((Processing, Some(1000), Some(250))),
                10,
                keep(8, "partial_refund"),
            ),
            (
                Some((Succeeded, Some(300), Some(100))),
                3,
                keep(2, "partial_refund"),
            ),
            // Less than one token's worth: nothing taken back.
            (Some((Succeeded, Some(1000), Some(99))), 10, ALL),
            (Some((Succeeded, Some(1000), Some(999))), 1, ALL),
            // Over-reported refunds are capped at the amount, negative ones count as none.
            (
                Some((Succeeded, Some(1000), Some(5000))),
                10,
                keep(0, "partial_refund"),
            ),
            (Some((Succeeded, Some(1000), Some(-5))), 10, ALL),
            // quantity × refunded overflows i64: computed wide, still exact.
            (
                Some((Succeeded, Some(i64::MAX), Some(i64::MAX / 2))),
                1_000_000,
                keep(500_001, "partial_refund"),
            ),
            // A refund of unknown proportion (no amount, or an amount of 0) is a full one.
            (Some((Succeeded, None, Some(10))), 10, keep(0, "refunded")),
            (
                Some((Processing, Some(0), Some(10))),
                10,
                keep(0, "refunded"),
            ),
        ];
        for (state, quantity, expected) in table {
            let doc = state.map(|(status, amount, refunded)| payment(status, amount, refunded));
            assert_eq!(
                entitlement(doc.as_ref(), quantity),
                expected,
                "{state:?} × {quantity} tokens"
            );
        }
    }
}
