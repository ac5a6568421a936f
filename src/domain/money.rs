//! The money rule, in one place: how much of a payment its provider has taken back for
//! good, and how many of the payment's tokens that leaves standing. The webhook effects,
//! every settle and `verify` all decide with [`entitlement`], so the rule cannot drift
//! between what tokenmint does and what it checks.
//!
//! A payment of `amount` for `quantity` tokens is entitled to
//! `quantity − floor(quantity × withdrawn ÷ amount)` tokens, where `withdrawn` is what
//! was refunded or charged back minus what came back (a dispute won, a refund that
//! failed, a chargeback reversed), never below 0 nor above `amount`.

use super::PaymentStatus;

/// The kind that starts a chargeback's withdrawal id (`chargeback:…`).
pub const CHARGEBACK_KIND: &str = "chargeback:";

/// The kind that starts the withdrawal id of what a payment's capture left of its
/// authorisation (`uncaptured:…`, followed by the payment's id).
pub const UNCAPTURED_KIND: &str = "uncaptured:";

/// One withdrawal among a payment's refunds, as recorded: a refund, chargeback or
/// dispute, under its own id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withdrawal {
    pub id: String,
    /// Minor units taken back (for a running total, the largest it was reported at).
    pub amount: i64,
    /// The provider called it a withdrawal of the whole payment: it counts as the
    /// payment's amount whatever its own amount says.
    pub full: bool,
    /// For a running total (a charge's refunds so far): when it was last reported (unix
    /// seconds).
    pub reported_at: Option<i64>,
    /// Of `amount`, the release of what a capture in part left uncaptured
    /// (`RecordedRelease::in_total`; 0: none): money the payment's `uncaptured:`
    /// withdrawal may name as well, counted once.
    pub release: i64,
}

/// What one report of a running total (a Stripe charge captured in part) says of the
/// release of what its capture left uncaptured, which a capture made before Stripe's API
/// version 2025-03-31 counted among the charge's refunds and one made since did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseReport {
    /// What the charge had captured when reported: a charge captured in several parts
    /// reports more as it goes, and only the latest capture's release is released.
    pub captured: i64,
    /// What the capture left uncaptured: the charge's amount less what it captured.
    pub released: i64,
    /// What the report's amounts prove: `Some(true)` the total holds the release (it is
    /// above what was captured, which refunds alone never are), `Some(false)` it does not
    /// (it is below the release, or the charge is refunded whole for less than its
    /// amount); `None`: either could be.
    pub proven: Option<bool>,
    /// Where nothing is proven, whether the event's API version says it holds it.
    pub guessed: bool,
}

/// What a running total's reports have said of its release, together: the proofs of the
/// reports of its largest capture stay once made (the capture did what it did; a report
/// made between the parts of a capture in several proves nothing of the last), and the
/// guess is that of the earliest of them, rendered nearest the capture (an endpoint's
/// version upgraded later says nothing of how the capture was made).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordedRelease {
    pub released: i64,
    pub held: bool,
    pub not_held: bool,
    pub guessed: bool,
}

impl RecordedRelease {
    /// How much of the total is the release: all of it once proven held, none once
    /// proven not held (a report above what was captured would prove it held again,
    /// which only a capture in several parts could show; held wins), else as guessed.
    pub fn in_total(&self) -> i64 {
        if self.held || (!self.not_held && self.guessed) {
            self.released.max(0)
        } else {
            0
        }
    }
}

/// Money that came back to the merchant, under its own id (the refund, dispute or
/// chargeback it reverses, prefixed by its kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reversal {
    /// Names this reversal among the payment's reversals: a replay counts once.
    pub id: String,
    /// Minor units given back.
    pub amount: i64,
    /// The withdrawal it gives back, when the provider names it: it then counts only
    /// once that withdrawal is recorded, and never for more than it (a reversal that
    /// arrives before its withdrawal waits for it instead of offsetting another one).
    /// `None`: a reversed chargeback that names none (Paddle's); it gives back only what
    /// the payment's chargebacks (withdrawals of the `chargeback:` kind) took, never a
    /// refund, and waits while none is recorded.
    pub of: Option<String>,
    /// When the provider reported it (unix seconds): a running total reported later
    /// already leaves it out (see `Store::record_refund`).
    pub at: Option<i64>,
    /// For one refund of a running total: when that refund was made (unix seconds). It
    /// gives back only once a report of the total made since then is recorded: a report
    /// made before it cannot count it, and its failure must not give back another refund.
    pub since: Option<i64>,
}

/// What a payment's records say of its money.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Money {
    /// The payment's amount, when known.
    pub amount: Option<i64>,
    pub withdrawals: Vec<Withdrawal>,
    pub reversals: Vec<Reversal>,
    /// A refunded total recorded before withdrawals were kept one by one: at least that
    /// much was taken back (also the sum of the withdrawals as recorded, which never
    /// exceeds it otherwise; but for a release two of them name, which it counts twice).
    pub recorded_total: Option<i64>,
    /// What the captures of a payment captured in part add up to, below `amount` (the
    /// authorisation): what a withdrawal of the whole payment took (`with_uncaptured`).
    pub captured: Option<i64>,
}

impl Money {
    /// Everything taken back, before reversals: a full withdrawal counts as the amount,
    /// and a release both a refund and the `uncaptured:` withdrawal name counts once.
    pub fn gross(&self) -> i64 {
        let sum: i64 = self.withdrawals.iter().map(|w| self.counted(w)).sum();
        match self.release_named_twice() {
            // The recorded total counts that release twice as well: the withdrawals say.
            0 => sum.max(self.recorded_total.unwrap_or(0)),
            twice => sum - twice,
        }
    }

    /// The release of an uncaptured rest that is counted twice in the withdrawals' sum:
    /// recorded as `uncaptured:` (from the success) and inside a refund's running total
    /// (from the charge, which counted it as a refund). The two learn it from different
    /// events, in either order, so each records it whole. A total's release counts only
    /// when it is the success's: a charge reported between the parts of a capture in
    /// several names the rest of that moment, which the last part then shrank, and
    /// which was never released.
    fn release_named_twice(&self) -> i64 {
        let uncaptured: i64 = self
            .withdrawals
            .iter()
            .filter(|w| w.id.starts_with(UNCAPTURED_KIND))
            .map(|w| w.amount)
            .sum();
        let in_refunds: i64 = self
            .withdrawals
            .iter()
            .filter(|w| w.release > 0 && w.release == uncaptured)
            .map(|w| w.release)
            .sum();
        uncaptured.min(in_refunds)
    }

    /// What one withdrawal counts for: one of the whole payment, at least what the
    /// payment's captures took (its amount, when captured whole).
    fn counted(&self, withdrawal: &Withdrawal) -> i64 {
        match (withdrawal.full, self.captured.or(self.amount)) {
            (true, Some(whole)) => withdrawal.amount.max(whole),
            _ => withdrawal.amount,
        }
    }

    /// Everything that came back: each reversal once, one that names its withdrawal only
    /// once that is known (and counts it: `counts_in`) and, with the others of that
    /// withdrawal, for at most its amount; those naming none, together, for at most what
    /// the chargebacks took, and for all of it once they reach the chargebacks' own
    /// amounts.
    pub fn reversed(&self) -> i64 {
        let mut unnamed = 0;
        let mut named: Vec<(&str, i64)> = Vec::new();
        for reversal in &self.reversals {
            let amount = reversal.amount.max(0);
            match &reversal.of {
                None => unnamed += amount,
                Some(of) if !self.counts_in(reversal, of) => {}
                Some(of) => match named.iter_mut().find(|(id, _)| id == of) {
                    Some((_, sum)) => *sum += amount,
                    None => named.push((of, amount)),
                },
            }
        }
        let chargebacks = || {
            self.withdrawals
                .iter()
                .filter(|w| w.id.starts_with(CHARGEBACK_KIND))
        };
        let charged_back: i64 = chargebacks().map(|w| self.counted(w)).sum();
        // Reversals that name nothing (Paddle's) undo the chargebacks whole once they give
        // back all the chargebacks named, as a named one does below: a chargeback of the
        // 300 left after a refund of 700, read as the whole payment, reversed for 300,
        // leaves the refund alone withdrawn. Only while every chargeback says what it
        // named (an amount above 0).
        let own: i64 = chargebacks().map(|w| w.amount).sum();
        let all_named = chargebacks().all(|w| w.amount > 0);
        let mut reversed = if all_named && own > 0 && unnamed >= own {
            charged_back
        } else {
            unnamed.min(charged_back)
        };
        for (of, sum) in named {
            if let Some(withdrawal) = self.withdrawals.iter().find(|w| w.id == of) {
                // A chargeback read as the whole payment (Adyen's, whatever its own
                // amount) reversed for all it named is undone whole: a chargeback of 400
                // reversed for 400 leaves nothing withdrawn. Only a chargeback's own
                // amount says what it named; a full refund's stored amount may be 0 (it
                // named none) or a partial report before it, so its reversals give back
                // what they say.
                let whole_chargeback = withdrawal.id.starts_with(CHARGEBACK_KIND)
                    && withdrawal.amount > 0
                    && sum >= withdrawal.amount;
                let counted = self.counted(withdrawal);
                reversed += if whole_chargeback {
                    counted
                } else {
                    sum.min(counted)
                };
            }
        }
        reversed
    }

    /// Whether the withdrawal `of` counts what `reversal` gives back: a reversal of one
    /// refund within a running total does only once a report of the total made since
    /// that refund is recorded (to the second: Stripe's clock). Before, the total is
    /// still without it, and giving it back would give back another refund.
    fn counts_in(&self, reversal: &Reversal, of: &str) -> bool {
        let reported_at = self
            .withdrawals
            .iter()
            .find(|w| w.id == of)
            .and_then(|w| w.reported_at);
        match (reversal.since, reported_at) {
            (Some(since), Some(reported_at)) => reported_at >= since,
            _ => true,
        }
    }

    /// What is taken back for good: withdrawals minus reversals, never below 0 and, when
    /// the amount is known, never above it.
    pub fn withdrawn(&self) -> i64 {
        let net = (self.gross() - self.reversed()).max(0);
        match self.amount {
            Some(amount) if amount > 0 => net.min(amount),
            _ => net,
        }
    }

    /// Whether the withdrawals explain a `refunded` status, so that the money decides
    /// instead: they reach the whole amount (a full one does); or none was called full,
    /// and the refund was judged whole only because the payment's amount was not known
    /// then (a withdrawal of unknown share reads as all of it, until the amount is
    /// known); or the amount is still unknown. A refund the provider called full is
    /// recorded as a full withdrawal, so it explains the status and comes back only by a
    /// reversal of it.
    pub fn explains_refund(&self) -> bool {
        let gross = self.gross();
        let called_full = self.withdrawals.iter().any(|w| w.full);
        gross > 0
            && self
                .amount
                .is_none_or(|amount| gross >= amount || !called_full)
    }

    /// Whether less than the whole payment is withdrawn now: some is left, or, the
    /// amount unknown, nothing is withdrawn at all.
    pub fn leaves_some(&self) -> bool {
        match self.amount {
            Some(amount) if amount > 0 => self.withdrawn() < amount,
            _ => self.withdrawn() == 0,
        }
    }

    /// This money, for payment `payment` authorised for `authorised` and captured in the
    /// parts `captures` (Adyen under manual capture). Captured for less than was
    /// authorised, the payment stands only for what was captured: the tokens were asked
    /// for the authorised amount, so that is the amount the rule measures against, and
    /// what no capture took (yet) counts as withdrawn (`uncaptured:<payment>`). A later
    /// capture shrinks it, and the settle that follows brings back the tokens it pays
    /// for, as it does for money that came back. A refund or chargeback of the whole
    /// payment took what was captured (at least its own amount), not the authorisation,
    /// whose rest is counted once, here: otherwise money coming back would give back
    /// too little. Such a withdrawal keeps its own amount, which says what a chargeback
    /// named: reversed for all of that, it is undone whole. Without captures, or captured
    /// for all of it, the money is unchanged.
    pub fn with_uncaptured(
        mut self,
        payment: &str,
        authorised: Option<i64>,
        captures: &[i64],
    ) -> Self {
        let captured: i64 = captures.iter().sum();
        let Some(authorised) = authorised.filter(|a| !captures.is_empty() && captured < *a) else {
            return self;
        };
        self.captured = Some(captured);
        self.withdrawals.push(Withdrawal {
            id: format!("{UNCAPTURED_KIND}{payment}"),
            amount: authorised - captured,
            full: false,
            reported_at: None,
            release: 0,
        });
        self.amount = Some(authorised.max(self.amount.unwrap_or(0)));
        self
    }
}

/// How many of its `quantity` tokens a payment is entitled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entitlement {
    /// Every token: the payment stands (or tokenmint knows nothing against it).
    All,
    /// Tokens 0..keep-1 only; the rest are taken back (`reason` says why, and becomes
    /// the revoked tokens' `revocationReason`).
    Keep { keep: i64, reason: RevocationReason },
}

/// Why the money took tokens back: a revoked token's `revocationReason`, and the
/// `reason` label of `tokenmint_tokens_revoked_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevocationReason {
    /// The payment was refunded (or charged back) whole.
    Refunded,
    /// The payment was canceled.
    Canceled,
    /// The payment's money failed after a success.
    Failed,
    /// A share of the payment was refunded (or charged back).
    PartialRefund,
}

impl RevocationReason {
    /// Every reason, as the metrics register them.
    pub const ALL: [Self; 4] = [
        Self::Refunded,
        Self::Canceled,
        Self::Failed,
        Self::PartialRefund,
    ];

    /// The stored and exported name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refunded => "refunded",
            Self::Canceled => "canceled",
            Self::Failed => "failed",
            Self::PartialRefund => "partial_refund",
        }
    }
}

impl Entitlement {
    /// The number of tokens kept out of `quantity`.
    pub fn kept(self, quantity: i64) -> i64 {
        match self {
            Self::All => quantity,
            Self::Keep { keep, .. } => keep.clamp(0, quantity.max(0)),
        }
    }
}

/// Which of a payment's tokens the share it no longer stands for takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareTaken {
    /// Every token at or above this tokenIndex is taken back or was spent; every one
    /// below it stands.
    pub from: i64,
    /// What of the share no unspent token is left for: spent before it was taken.
    pub shortfall: u64,
}

/// Which of a payment's `quantity` tokens the share it no longer stands for (`quantity −
/// kept`) takes back, given the tokenIndexes of those spent (`redeemed`): counted from
/// the highest tokenIndex down, passing over the spent ones, so that a customer who spent
/// the highest tokens before a refund loses lower ones instead of keeping more than the
/// money pays for. Positions only spending moves: tokens not written yet, revoked by
/// anyone or active all count alike, so settles of a set still being written, or after an
/// operator's revoke, find the same boundary, and a settle that takes by it takes no
/// token twice. Without spent tokens, the share is the highest `quantity − kept`.
pub fn share_taken(quantity: i64, kept: i64, redeemed: &[i64]) -> ShareTaken {
    let share = (quantity - kept).max(0);
    let spent: std::collections::HashSet<i64> = redeemed.iter().copied().collect();
    let mut taken = 0;
    let mut from = quantity.max(0);
    while taken < share && from > 0 {
        from -= 1;
        if !spent.contains(&from) {
            taken += 1;
        }
    }
    ShareTaken {
        from,
        shortfall: (share - taken) as u64,
    }
}

/// The entitlement of a payment of `quantity` tokens in `status` with `money`.
///
/// Canceled and failed payments keep nothing. A refunded one keeps nothing either,
/// unless its withdrawals explain the refund and reversals since gave some back: then
/// the money decides, as for a standing payment. A standing payment keeps
/// `quantity − floor(quantity × withdrawn ÷ amount)`; money taken back from a payment of
/// unknown amount is of unknown proportion, which can only be read as all of it.
pub fn entitlement(status: PaymentStatus, money: &Money, quantity: i64) -> Entitlement {
    let none = |reason| Entitlement::Keep { keep: 0, reason };
    match status {
        PaymentStatus::Canceled => return none(RevocationReason::Canceled),
        // Only reachable with tokens when the money failed after a success (Adyen's
        // CAPTURE_FAILED): none of them were paid for.
        PaymentStatus::Failed => return none(RevocationReason::Failed),
        PaymentStatus::Refunded if !money.explains_refund() => {
            return none(RevocationReason::Refunded);
        }
        PaymentStatus::Refunded | PaymentStatus::Processing | PaymentStatus::Succeeded => {}
    }
    let withdrawn = money.withdrawn();
    if withdrawn == 0 {
        return Entitlement::All;
    }
    match money.amount {
        Some(amount) if amount > 0 => {
            // i128: quantity × amount can exceed i64 for absurd amounts.
            let share = (i128::from(quantity) * i128::from(withdrawn) / i128::from(amount)) as i64;
            if share == 0 {
                Entitlement::All
            } else {
                Entitlement::Keep {
                    keep: quantity - share,
                    reason: if status == PaymentStatus::Refunded && withdrawn == amount {
                        RevocationReason::Refunded
                    } else {
                        RevocationReason::PartialRefund
                    },
                }
            }
        }
        _ => none(RevocationReason::Refunded),
    }
}

#[cfg(test)]
mod tests {
    use super::RevocationReason as R;
    use super::*;

    fn w(id: &str, amount: i64, full: bool) -> Withdrawal {
        Withdrawal {
            id: id.to_owned(),
            amount,
            full,
            reported_at: None,
            release: 0,
        }
    }

    fn r(id: &str, amount: i64, of: Option<&str>) -> Reversal {
        Reversal {
            id: id.to_owned(),
            amount,
            of: of.map(str::to_owned),
            at: None,
            since: None,
        }
    }

    #[test]
    fn a_refunds_failure_gives_back_only_once_a_report_since_that_refund_is_recorded() {
        // A charge's refunds so far: 500, last reported at 10.
        let total = Withdrawal {
            reported_at: Some(10),
            ..w("charge:ch", 500, false)
        };
        let failed = |since| Reversal {
            since,
            ..r("refund:re_2", 500, Some("charge:ch"))
        };
        let withdrawn = |reversal| {
            Money {
                amount: Some(1000),
                withdrawals: vec![total.clone()],
                reversals: vec![reversal],
                recorded_total: None,
                captured: None,
            }
            .withdrawn()
        };
        // re_2, made at 15, is in no report yet: its failure waits.
        assert_eq!(withdrawn(failed(Some(15))), 500);
        // Made at 10 or before, the report at 10 counted it: given back.
        assert_eq!(withdrawn(failed(Some(10))), 0);
        assert_eq!(withdrawn(failed(Some(3))), 0);
        // Without the refund's time (another provider's, or recorded before it was
        // kept), as before.
        assert_eq!(withdrawn(failed(None)), 0);
        // A total that does not say when it was reported, as before.
        let unreported = Money {
            amount: Some(1000),
            withdrawals: vec![w("charge:ch", 500, false)],
            reversals: vec![failed(Some(15))],
            recorded_total: None,
            captured: None,
        };
        assert_eq!(unreported.withdrawn(), 0);
    }

    /// A chargeback read as the whole payment (`full`) for what was left after a refund,
    /// reversed by reversals that name nothing (Paddle's), for all it named: only the
    /// refund stays withdrawn. Reversed in part, or a second chargeback since, it stands.
    #[test]
    fn unnamed_reversals_of_all_a_chargeback_named_undo_it_whole() {
        let money = |withdrawals, reversals| Money {
            amount: Some(1000),
            withdrawals,
            reversals,
            recorded_total: None,
            captured: None,
        };
        let refund = || w("adjustment:r", 700, false);
        let chargeback = |id: &str| w(&format!("chargeback:{id}"), 300, true);
        let reverse = |id: &str, amount| r(&format!("adjustment:{id}"), amount, None);
        let whole = money(vec![refund(), chargeback("c")], vec![reverse("x", 300)]);
        assert_eq!(whole.withdrawn(), 700);
        let in_part = money(vec![refund(), chargeback("c")], vec![reverse("x", 200)]);
        assert_eq!(in_part.withdrawn(), 1000);
        let again = money(
            vec![refund(), chargeback("c"), chargeback("d")],
            vec![reverse("x", 300)],
        );
        assert_eq!(again.withdrawn(), 1000, "the second chargeback stands");
        let both_back = money(
            vec![refund(), chargeback("c"), chargeback("d")],
            vec![reverse("x", 300), reverse("y", 300)],
        );
        assert_eq!(both_back.withdrawn(), 700);
        // A chargeback that named no amount: reversals give back what they say.
        let unnamed_amount = money(
            vec![refund(), w("chargeback:z", 0, true)],
            vec![reverse("x", 300)],
        );
        assert_eq!(unnamed_amount.withdrawn(), 1000);
    }

    #[test]
    fn withdrawn_is_withdrawals_minus_reversals_clamped() {
        let money = |withdrawals, reversals| Money {
            amount: Some(1000),
            withdrawals,
            reversals,
            recorded_total: None,
            captured: None,
        };
        let cases: Vec<(Money, i64)> = vec![
            (money(vec![], vec![]), 0),
            (money(vec![w("charge:a", 300, false)], vec![]), 300),
            (money(vec![w("charge:a", 300, true)], vec![]), 1000),
            // A dispute won gives its amount back.
            (
                money(
                    vec![w("charge:a", 300, false), w("dispute:d", 200, false)],
                    vec![r("dispute:d", 200, Some("dispute:d"))],
                ),
                300,
            ),
            // A reversal before its withdrawal waits for it.
            (
                money(
                    vec![w("charge:a", 300, false)],
                    vec![r("dispute:d", 200, Some("dispute:d"))],
                ),
                300,
            ),
            // Never more than the withdrawal it reverses.
            (
                money(
                    vec![w("refund:x", 100, false), w("refund:y", 100, false)],
                    vec![r("refund:x", 900, Some("refund:x"))],
                ),
                100,
            ),
            // Unnamed reversals give back chargebacks only, never a refund, never below 0.
            (
                money(vec![w("total", 100, false)], vec![r("rev", 500, None)]),
                100,
            ),
            (
                money(
                    vec![w("adjustment:r", 500, false), w("chargeback:c", 300, false)],
                    vec![r("adjustment:v", 500, None)],
                ),
                500,
            ),
            (
                money(
                    vec![w("chargeback:a", 200, false), w("chargeback:b", 300, false)],
                    vec![r("adjustment:v", 250, None), r("adjustment:w", 250, None)],
                ),
                0,
            ),
            // A chargeback read as the whole payment, reversed for all it named, is
            // undone; reversed for part of it, that part comes back.
            (
                money(
                    vec![w("chargeback:c", 400, true)],
                    vec![r("chargeback:c", 400, Some("chargeback:c"))],
                ),
                0,
            ),
            (
                money(
                    vec![w("chargeback:c", 400, true)],
                    vec![r("chargeback:c", 300, Some("chargeback:c"))],
                ),
                700,
            ),
            // A full refund of no amount, or of a partial report, reinstated in part.
            (
                money(
                    vec![w("total", 0, true)],
                    vec![r("total", 250, Some("total"))],
                ),
                750,
            ),
            (
                money(
                    vec![w("total", 300, true)],
                    vec![r("total", 300, Some("total"))],
                ),
                700,
            ),
            // A full chargeback reversed in full.
            (
                money(
                    vec![w("chargeback:c", 1000, true)],
                    vec![r("chargeback:c", 1000, Some("chargeback:c"))],
                ),
                0,
            ),
            // Over-reported refunds are capped at the amount.
            (money(vec![w("refund:x", 5000, false)], vec![]), 1000),
        ];
        for (money, expected) in cases {
            assert_eq!(money.withdrawn(), expected, "{money:?}");
        }
        let legacy = Money {
            amount: Some(1000),
            recorded_total: Some(400),
            ..Money::default()
        };
        assert_eq!(
            legacy.withdrawn(),
            400,
            "a total recorded before the entries"
        );
    }

    #[test]
    fn entitlement_follows_the_money() {
        use PaymentStatus::*;
        let money = |amount: Option<i64>, withdrawn: i64, back: i64| Money {
            amount,
            withdrawals: vec![w("refund:a", withdrawn, false)],
            reversals: vec![r("refund:a", back, Some("refund:a"))],
            recorded_total: None,
            captured: None,
        };
        let keep = |keep, reason| Entitlement::Keep { keep, reason };
        let cases = [
            (Succeeded, money(Some(1000), 0, 0), 10, Entitlement::All),
            (
                Succeeded,
                money(Some(1000), 250, 0),
                10,
                keep(8, R::PartialRefund),
            ),
            (Succeeded, money(Some(1000), 250, 250), 10, Entitlement::All),
            (Succeeded, money(Some(1000), 99, 0), 10, Entitlement::All),
            (Succeeded, money(None, 10, 0), 10, keep(0, R::Refunded)),
            (
                Refunded,
                money(Some(1000), 1000, 0),
                10,
                keep(0, R::Refunded),
            ),
            // Refunded by its money, half of it back: half the tokens stand.
            (
                Refunded,
                money(Some(1000), 1000, 500),
                10,
                keep(5, R::PartialRefund),
            ),
            (
                Refunded,
                money(Some(1000), 1000, 1000),
                10,
                Entitlement::All,
            ),
            // Refunded without money that explains it (the provider's word only).
            (Refunded, money(Some(1000), 0, 0), 10, keep(0, R::Refunded)),
            // Judged whole while the amount was unknown: the money decides once known.
            (
                Refunded,
                money(Some(1000), 250, 0),
                10,
                keep(8, R::PartialRefund),
            ),
            (Refunded, money(None, 250, 0), 10, keep(0, R::Refunded)),
            (Refunded, money(None, 250, 250), 10, Entitlement::All),
            (Canceled, money(Some(1000), 0, 0), 10, keep(0, R::Canceled)),
            (Failed, money(Some(1000), 0, 0), 10, keep(0, R::Failed)),
        ];
        for (status, money, quantity, expected) in cases {
            assert_eq!(
                entitlement(status, &money, quantity),
                expected,
                "{status:?} {money:?}"
            );
        }
        assert_eq!(keep(8, R::Refunded).kept(10), 8);
        assert_eq!(Entitlement::All.kept(10), 10);
    }

    #[test]
    fn a_share_is_counted_from_the_top_passing_over_spent_tokens() {
        let taken = |quantity, kept, redeemed: &[i64]| {
            let t = share_taken(quantity, kept, redeemed);
            (t.from, t.shortfall)
        };
        // Nothing spent: the highest positions.
        assert_eq!(taken(4, 2, &[]), (2, 0));
        assert_eq!(taken(4, 4, &[]), (4, 0));
        assert_eq!(taken(4, 0, &[]), (0, 0));
        // The highest spent: lower ones taken instead.
        assert_eq!(taken(4, 2, &[3]), (1, 0));
        assert_eq!(taken(4, 2, &[2, 3]), (0, 0));
        assert_eq!(taken(10, 5, &[5, 6, 7, 8, 9]), (0, 0));
        // Spent below the share: it changes nothing.
        assert_eq!(taken(4, 2, &[0]), (2, 0));
        // Too few unspent: the rest is short.
        assert_eq!(taken(4, 2, &[1, 2, 3]), (0, 1));
        assert_eq!(taken(4, 0, &[1, 3]), (0, 2));
        // No set: everything from 0.
        assert_eq!(taken(0, 0, &[]), (0, 0));
    }

    #[test]
    fn a_recorded_release_counts_when_proven_held_or_guessed_and_never_proven_otherwise() {
        let release = |held, not_held, guessed| {
            RecordedRelease {
                released: 300,
                held,
                not_held,
                guessed,
            }
            .in_total()
        };
        assert_eq!(release(true, false, false), 300, "proven held");
        assert_eq!(
            release(false, true, true),
            0,
            "proven not held, whatever the guess"
        );
        assert_eq!(release(false, false, true), 300, "guessed held");
        assert_eq!(release(false, false, false), 0, "guessed not held");
        assert_eq!(release(true, true, false), 300, "held wins");
    }

    #[test]
    fn a_release_both_the_success_and_the_charges_refunds_name_counts_once() {
        let uncaptured = w("uncaptured:pi_1", 600, false);
        // The charge counted the release (600) among its refunds, with 100 refunded.
        let charge = Withdrawal {
            release: 600,
            ..w("charge:ch_1", 700, false)
        };
        let money = |withdrawals: Vec<Withdrawal>| Money {
            amount: Some(1000),
            withdrawals,
            ..Money::default()
        };
        assert_eq!(
            money(vec![uncaptured.clone(), charge.clone()]).withdrawn(),
            700
        );
        // Either alone says as much of the release.
        assert_eq!(money(vec![charge.clone()]).withdrawn(), 700);
        assert_eq!(money(vec![uncaptured.clone()]).withdrawn(), 600);
        // The recorded total (the entries' sum, 1300) names it twice too: the entries say.
        let recorded = Money {
            recorded_total: Some(1300),
            ..money(vec![uncaptured.clone(), charge.clone()])
        };
        assert_eq!(recorded.withdrawn(), 700);
        // A charge whose refunds do not hold it: both count.
        let refunds_only = w("charge:ch_1", 100, false);
        assert_eq!(money(vec![uncaptured, refunds_only]).withdrawn(), 700);
    }

    #[test]
    fn a_payment_captured_in_part_stands_for_what_was_captured() {
        // 10 tokens authorised for 1000; `refunds` and `reversals` as recorded; the
        // payment's `amount` is what its captures add up to.
        let keep = |captures: &[i64], withdrawals: Vec<Withdrawal>, reversals: Vec<Reversal>| {
            let captured: i64 = captures.iter().sum();
            let money = Money {
                amount: Some(captured),
                withdrawals,
                reversals,
                recorded_total: None,
                captured: None,
            }
            .with_uncaptured("psp_1", Some(1000), captures);
            let status = if money.leaves_some() {
                PaymentStatus::Succeeded
            } else {
                PaymentStatus::Refunded
            };
            entitlement(status, &money, 10).kept(10)
        };
        assert_eq!(keep(&[600], vec![], vec![]), 6);
        // Captured in parts, the later ones bring back what they pay for.
        assert_eq!(keep(&[300, 500], vec![], vec![]), 8);
        assert_eq!(keep(&[300, 500, 200], vec![], vec![]), 10);
        // More than was authorised: nothing left uncaptured.
        assert_eq!(keep(&[1200], vec![], vec![]), 10);
        // A refund of half of what was captured.
        assert_eq!(keep(&[600], vec![w("refund:r", 300, false)], vec![]), 3);
        // A whole refund takes what was captured; its failure gives that back.
        let whole = || vec![w("refund:r", 600, true)];
        assert_eq!(keep(&[600], whole(), vec![]), 0);
        assert_eq!(
            keep(&[600], whole(), vec![r("refund:r", 600, Some("refund:r"))]),
            6
        );
        // A whole chargeback (Adyen names its amount), half of it reversed.
        let chargeback = vec![w("chargeback:c", 600, true)];
        let reversed = vec![r("chargeback:c", 300, Some("chargeback:c"))];
        assert_eq!(keep(&[600], chargeback, reversed), 3);
        // One that named less than was captured takes it all, and reversed for all it
        // named is undone whole.
        let chargeback = || vec![w("chargeback:c", 400, true)];
        assert_eq!(keep(&[600], chargeback(), vec![]), 0);
        let reversed = vec![r("chargeback:c", 400, Some("chargeback:c"))];
        assert_eq!(keep(&[600], chargeback(), reversed), 6);
        // No authorisation known (a capture before it), or no capture yet: as recorded.
        let plain = Money {
            amount: Some(600),
            withdrawals: vec![],
            reversals: vec![],
            recorded_total: None,
            captured: None,
        };
        assert_eq!(plain.clone().with_uncaptured("psp_1", None, &[600]), plain);
        assert_eq!(
            plain.clone().with_uncaptured("psp_1", Some(1000), &[]),
            plain
        );
    }
}
