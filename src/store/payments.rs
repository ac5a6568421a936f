//! The `payments` projection: each payment's state as its provider last reported it,
//! written by a version-gated pipeline upsert. The filter is the unique key only; whether
//! the incoming event is newer is decided inside the update, atomically, by `$cond` over
//! `$$ROOT`, so an older event never overwrites a newer one whatever order or concurrency
//! they arrive in. An older event still contributes the facts the state lacks (token
//! metadata, amount, date). On top of the version, the caller's [`ProjectionGate`] names
//! when the event changes nothing at all; the store only executes it. Refunds are recorded
//! apart from the state, one amount per refund id, because they only grow and add up
//! whatever order they arrive in.

use futures::TryStreamExt;
use mongodb::ClientSession;
use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::options::ReturnDocument;
use serde::Deserialize;

use super::atomic::{commit_with_retry, pause_before_transaction, transaction_gave_up};
use super::documents::{RevokedShare, bson_time, from_document};
use super::durability::{abort_quietly, start_snapshot_transaction};
use super::error::{StoreError, is_transient_transaction_error};
use super::filters::{active_from_filter, issuance_filter, payment_tokens_filter};
use super::indexes::PAYMENTS_INDEX;
use super::retry;
use super::{Store, TOKENS};
use crate::domain::{
    Actor, CapturedPart, IssuanceParams, Money, Owner, PaymentEvent, PaymentKey, PaymentStatus,
    Quantity, RecordedRelease, Refund, ReleaseReport, Reversal, RevocationReason, ShareTaken,
    TokenType, Withdrawal, share_taken,
};

pub const PAYMENTS: &str = "payments";

/// The field that carries, for the length of one projection, whether its gate held the
/// event back; never stored.
const HELD_BACK: &str = "_heldBack";

/// The token parameters a payment's metadata named.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenParamsDoc {
    pub owner: ObjectId,
    pub token_type: String,
    pub quantity: i64,
}

impl TokenParamsDoc {
    /// Back to domain parameters (stored values were validated when written).
    pub fn params(&self) -> Option<IssuanceParams> {
        Some(IssuanceParams {
            owner: Owner::from_object_id(self.owner),
            token_type: TokenType::parse(&self.token_type).ok()?,
            quantity: Quantity::from_i64(self.quantity, u32::MAX).ok()?,
        })
    }
}

/// One document of `payments`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentDoc {
    pub provider: String,
    pub account_id: String,
    pub payment_intent_id: String,
    /// As last reported; `processing` while only a partial refund has been heard of.
    #[serde(default = "status_before_any_event")]
    pub status: PaymentStatus,
    /// 0 while only a partial refund has been heard of (it is no state change).
    #[serde(default)]
    pub version: i64,
    pub amount: Option<i64>,
    pub currency: Option<String>,
    /// What an authorisation to be captured later was for (Adyen under manual capture):
    /// what the token parameters were asked for, which the captures may not reach.
    pub authorised_amount: Option<i64>,
    /// The captures of such a payment, one per capture id; `amount` is their sum.
    #[serde(default)]
    pub captures: Vec<CaptureEntry>,
    pub token_params: Option<TokenParamsDoc>,
    /// Why the metadata could not be used, when it could not.
    pub metadata_error: Option<String>,
    /// The event whose metadata fixed `token_params` for good (see
    /// [`ProjectionGate::fixes_params`]); no event rewrites them after it.
    pub token_params_fixed_by: Option<String>,
    pub payment_date: Option<DateTime>,
    /// The sum of the payment's refunds (`refunds`: one `{id, amount}` per refund,
    /// dispute or charge); it only grows.
    pub amount_refunded: Option<i64>,
    /// The withdrawals, one per refund, dispute, chargeback or charge.
    #[serde(default)]
    pub refunds: Vec<RefundEntry>,
    /// The money that came back, one per reversal id.
    #[serde(default)]
    pub reversals: Vec<ReversalEntry>,
    /// +1 on every write of `refunds` or `reversals`: a status moved by the money
    /// (`Store::move_status`) is moved only if the money is still as it was read.
    #[serde(default)]
    pub money_version: i64,
    #[serde(default)]
    pub last_event_id: String,
    #[serde(default)]
    pub last_event_type: String,
    pub created_at: DateTime,
    pub updated_at: DateTime,
}

/// One entry of a payment's `refunds`.
#[derive(Debug, Clone, Deserialize)]
pub struct RefundEntry {
    pub id: String,
    pub amount: i64,
    /// The provider called it a withdrawal of the whole payment (absent: it did not,
    /// or the entry was written before this was kept).
    #[serde(default)]
    pub full: bool,
    /// For a running total: when it was last reported.
    #[serde(default)]
    pub at: Option<i64>,
    /// For a Stripe charge captured in part: what its reports said of the release of the
    /// uncaptured rest, which its total may hold; absent for any other entry.
    #[serde(default)]
    pub release: Option<ReleaseEntry>,
}

/// What a running total's reports said of its release (`domain::RecordedRelease`). Its
/// `captured` and `guessedAt` are read only by the update that writes it
/// (`release_entry`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseEntry {
    #[serde(default)]
    pub released: i64,
    #[serde(default)]
    pub held: bool,
    #[serde(default)]
    pub not_held: bool,
    #[serde(default)]
    pub guessed: bool,
}

impl From<ReleaseEntry> for RecordedRelease {
    fn from(entry: ReleaseEntry) -> Self {
        Self {
            released: entry.released,
            held: entry.held,
            not_held: entry.not_held,
            guessed: entry.guessed,
        }
    }
}

/// One entry of a payment's `captures`, as the money rule reads it: its amount (its
/// `id` only keeps a part from counting twice, which the pipeline that writes it sees to).
#[derive(Debug, Clone, Deserialize)]
pub struct CaptureEntry {
    pub amount: i64,
}

/// One entry of a payment's `reversals`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReversalEntry {
    pub id: String,
    pub amount: i64,
    pub of: Option<String>,
    pub at: Option<i64>,
    /// For one refund of a running total: when that refund was made.
    #[serde(default)]
    pub since: Option<i64>,
}

/// The stages that record `capture` among the payment's `captures` (one amount per
/// capture id, only growing: a replay counts once) and make the payment's `amount` their
/// sum, whatever order the parts arrive in; nothing for a held-back event. A change of
/// the amount is a change of the money (`moneyVersion`).
fn captured(capture: &CapturedPart) -> [Document; 2] {
    let id = literal(capture.id.as_str());
    let captures = doc! { "$ifNull": ["$captures", []] };
    let others = doc! { "$filter": {
        "input": captures.clone(),
        "cond": { "$ne": ["$$this.id", id.clone()] },
    } };
    let known = doc! { "$max": { "$map": {
        "input": { "$filter": {
            "input": captures,
            "cond": { "$eq": ["$$this.id", id.clone()] },
        } },
        "in": "$$this.amount",
    } } };
    let unless_held_back = |field: &str, value: Bson| -> Document {
        doc! { "$cond": [format!("${HELD_BACK}"), format!("${field}"), value] }
    };
    [
        doc! { "$set": { "captures": unless_held_back("captures", doc! { "$concatArrays": [
            others,
            [ { "id": id, "amount": { "$max": [known, literal(capture.amount)] } } ],
        ] }.into()) } },
        doc! { "$set": {
            "amount": unless_held_back("amount", doc! { "$sum": "$captures.amount" }.into()),
            // Also for a part older than the state: the sweep of recent changes must see
            // the money it brought (`Issuer::repair_recent_withdrawals`).
            "updatedAt": unless_held_back("updatedAt", "$$NOW".into()),
            "moneyVersion": unless_held_back("moneyVersion", doc! { "$add": [
                { "$ifNull": ["$moneyVersion", 0_i64] }, 1_i64,
            ] }.into()),
        } },
    ]
}

fn status_before_any_event() -> PaymentStatus {
    PaymentStatus::Processing
}

impl PaymentDoc {
    /// The payment's unique key, as stored (validated when it was written).
    pub fn key(&self) -> Result<PaymentKey, StoreError> {
        super::documents::stored_key(&self.provider, &self.account_id, &self.payment_intent_id)
    }

    /// What the document records of the payment's money, for the money rule: with what
    /// its captures left of its authorisation, when it has both (`Money::with_uncaptured`).
    pub fn money(&self) -> Money {
        let captures: Vec<i64> = self.captures.iter().map(|c| c.amount).collect();
        Money {
            amount: self.amount,
            withdrawals: self
                .refunds
                .iter()
                .map(|r| Withdrawal {
                    id: r.id.clone(),
                    amount: r.amount,
                    full: r.full,
                    reported_at: r.at,
                    release: r
                        .release
                        .map_or(0, |release| RecordedRelease::from(release).in_total()),
                })
                .collect(),
            reversals: self
                .reversals
                .iter()
                .map(|r| Reversal {
                    id: r.id.clone(),
                    amount: r.amount,
                    of: r.of.clone(),
                    at: r.at,
                    since: r.since,
                })
                .collect(),
            recorded_total: self.amount_refunded,
            captured: None,
        }
        .with_uncaptured(&self.payment_intent_id, self.authorised_amount, &captures)
    }
}

/// The `release` of a running total's entry after `report`, made at `at`
/// (`domain::RecordedRelease`), from the entry's fields as stored (`stored("release.…")`).
/// The proofs are those of the reports of the largest capture: a report of a larger one
/// starts them over (what a charge captured in parts reported before its last part
/// proves nothing of the last one's release), one of the same capture adds its own, one
/// of a smaller one changes nothing. The guess is that of the earliest report of the
/// largest capture (`guessedAt`), whatever order they arrive in.
fn release_entry(report: &ReleaseReport, at: i64, stored: &dyn Fn(&str) -> Document) -> Document {
    let field = |name: &str| stored(&format!("release.{name}"));
    let captured = literal(report.captured);
    let stored_captured = doc! { "$ifNull": [field("captured"), -1_i64] };
    let larger = doc! { "$gt": [captured.clone(), stored_captured.clone()] };
    let same = doc! { "$eq": [captured.clone(), stored_captured] };
    // Of the largest capture: this report's own, or the stored one's joined with it.
    let kept = |own: Bson, joined: Document, name: &str| {
        doc! { "$cond": [
            larger.clone(),
            own,
            { "$cond": [same.clone(), joined, field(name)] },
        ] }
    };
    let proof = |held: bool, name: &str| {
        let proven = literal(report.proven == Some(held));
        kept(
            proven.clone().into(),
            doc! { "$or": [field(name), proven] },
            name,
        )
    };
    let earlier = doc! { "$lt": [literal(at), { "$ifNull": [field("guessedAt"), i64::MAX] }] };
    let earliest = |own: Document, name: &str| {
        kept(
            own.clone().into(),
            doc! { "$cond": [earlier.clone(), own, field(name)] },
            name,
        )
    };
    doc! {
        "captured": { "$max": [field("captured"), captured] },
        "released": kept(literal(report.released).into(), literal(report.released), "released"),
        "held": proof(true, "held"),
        "notHeld": proof(false, "notHeld"),
        "guessed": earliest(literal(report.guessed), "guessed"),
        "guessedAt": earliest(literal(at), "guessedAt"),
    }
}

/// When [`Store::project_payment`] applies an event: the conditions, chosen by the caller,
/// under which the event changes nothing at all (neither state nor facts), evaluated on
/// the stored document inside the update.
#[derive(Debug, Clone, Copy)]
pub struct ProjectionGate<'a> {
    /// The stored statuses a newer event may move the payment on from (a payment without
    /// a status reads as `processing`); from any other, it changes nothing.
    pub moves_from: &'a [PaymentStatus],
    /// Whether the event's valid metadata fixes the payment's parameters when it is
    /// written (`tokenParamsFixedBy`: the event id). Fixed parameters are never rewritten,
    /// nor voided, by any later event.
    pub fixes_params: bool,
    /// Whether the event changes nothing when the payment's parameters are fixed and the
    /// event names others (or invalid ones).
    pub bound_to_fixed_params: bool,
    /// Whether the event, when it fixes the parameters while none are fixed, also says what
    /// the payment is over what earlier attempts left: older than the state, it passes
    /// over their metadata error and writes its amount and currency over theirs.
    pub restates: bool,
    /// Whether the event changes nothing once the payment has a capture recorded (a
    /// cancellation: what it releases then is the rest the captures left, which the money
    /// counts as withdrawn already).
    pub yields_to_captures: bool,
}

/// A token's tokenIndex as stored (an integer of either width).
pub(super) fn token_index(token: &Document) -> Option<i64> {
    match token.get("tokenIndex")? {
        Bson::Int64(index) => Some(*index),
        Bson::Int32(index) => Some(i64::from(*index)),
        _ => None,
    }
}

/// Wraps a value so the aggregation pipeline reads it as data, never as `$field` or an
/// operator — event contents come from outside.
fn literal(value: impl Into<Bson>) -> Document {
    doc! { "$literal": value.into() }
}

/// Whether the stored payment's parameters are fixed (`tokenParamsFixedBy` is set).
fn params_fixed() -> Document {
    doc! { "$ne": [ { "$ifNull": ["$tokenParamsFixedBy", Bson::Null] }, Bson::Null ] }
}

/// `value` for `field`, unless the stored parameters are fixed: then the stored one.
fn unless_fixed(value: Bson, field: &str) -> Document {
    doc! { "$cond": [params_fixed(), format!("${field}"), literal(value)] }
}

/// Whether a field says what the payment costs, as a restating event writes it over an
/// earlier attempt's.
fn is_price(field: &str) -> bool {
    matches!(field, "amount" | "currency")
}

/// Whether a token parameter field (fixed once, `unless_fixed`) rather than a plain fact.
fn is_param(field: &str) -> bool {
    field == "tokenParams" || field == "tokenParamsFixedBy"
}

/// The facts `event` names (amount, currency, payment date, valid parameters and, when
/// `fixes_params`, what fixes them), as stored.
fn event_facts(event: &PaymentEvent, fixes_params: bool) -> Document {
    let mut facts = Document::new();
    if let Some(amount) = event.amount {
        facts.insert("amount", amount);
        if event.authorises_capture {
            facts.insert("authorisedAmount", amount);
        }
    }
    if let Some(currency) = &event.currency {
        facts.insert("currency", currency.as_str());
    }
    if let Some(date) = event.payment_date {
        facts.insert("paymentDate", bson_time(date));
    }
    if let Some(Ok(params)) = &event.token_params {
        facts.insert(
            "tokenParams",
            doc! {
                "owner": params.owner.object_id(),
                "tokenType": params.token_type.as_str(),
                "quantity": i64::from(params.quantity.get()),
            },
        );
    }
    if fixes_params {
        facts.insert("tokenParamsFixedBy", event.event_id.as_str());
    }
    facts
}

/// What an event newer than the stored state sets: its status, version and id, its
/// metadata's verdict, and its `facts` (parameters only where they are not fixed).
fn newer_sets(event: &PaymentEvent, facts: &Document) -> Document {
    let mut sets = doc! {
        "status": literal(event.status.as_str()),
        "version": literal(event.version),
        "lastEventId": literal(event.event_id.as_str()),
        "lastEventType": literal(event.event_type.as_str()),
        "updatedAt": "$$NOW",
    };
    match &event.token_params {
        Some(Ok(_)) => {
            sets.insert("metadataError", unless_fixed(Bson::Null, "metadataError"));
        }
        // Invalid metadata in a newer event voids older parameters that were not fixed:
        // nobody may issue from metadata the provider has since replaced with something
        // unusable.
        Some(Err(reason)) => {
            sets.insert(
                "metadataError",
                unless_fixed(reason.as_str().into(), "metadataError"),
            );
            sets.insert("tokenParams", unless_fixed(Bson::Null, "tokenParams"));
        }
        None => {}
    }
    for (field, value) in facts {
        let set = if is_param(field) {
            unless_fixed(value.clone(), field)
        } else {
            literal(value.clone())
        };
        sets.insert(field.clone(), set);
    }
    sets
}

/// What any event, older ones too, fills in where the state has nothing: `createdAt`,
/// and each of its `facts` where the stored field is missing (the parameters where
/// `params_gap` says so, the metadata verdict with them). An event that `restates` the
/// payment as it fixes the parameters writes its amount and currency where it writes
/// them. Filled or restated, a change of the amount is a change of the money
/// (`moneyVersion`, and `updatedAt` for the sweep of recent changes).
fn gaps_filled(event: &PaymentEvent, facts: &Document, restates: bool) -> Document {
    let fixes = facts.contains_key("tokenParamsFixedBy");
    let params_gap = params_gap(event, fixes, restates && fixes);
    let restated = (restates && fixes).then(|| params_gap.clone());
    let mut filled = doc! { "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] } };
    if matches!(event.token_params, Some(Ok(_))) {
        filled.insert(
            "metadataError",
            doc! { "$cond": [params_gap.clone(), Bson::Null, "$metadataError"] },
        );
    }
    let mut amount_gap = None;
    for (field, value) in facts {
        let current = format!("${field}");
        let missing = doc! { "$eq": [ { "$ifNull": [&current, Bson::Null] }, Bson::Null ] };
        let gap = match &restated {
            _ if is_param(field) => params_gap.clone(),
            Some(restated) if is_price(field) => doc! { "$or": [missing, restated] },
            _ => missing,
        };
        if field == "amount" {
            amount_gap = Some(gap.clone());
        }
        filled.insert(
            field.clone(),
            doc! { "$cond": [gap, literal(value.clone()), &current] },
        );
    }
    if let (Some(gap), Some(amount)) = (amount_gap, event.amount) {
        let moved = doc! { "$and": [gap, { "$ne": ["$amount", amount] }] };
        filled.insert(
            "moneyVersion",
            doc! { "$cond": [
                moved.clone(),
                { "$add": [ { "$ifNull": ["$moneyVersion", 0_i64] }, 1_i64 ] },
                "$moneyVersion",
            ] },
        );
        filled.insert(
            "updatedAt",
            doc! { "$cond": [moved, "$$NOW", "$updatedAt"] },
        );
    }
    filled
}

/// Whether an older event's metadata may fill the stored parameters: only where none are
/// stored, or, for an event that `fixes` them, none are fixed (the first success naming
/// valid ones fixes them whenever it arrives, a chargeback before it included, over what
/// a processing or declined attempt left); and only if none was ever judged unusable, or
/// if what was came from an event no newer than this one (the stored version is this
/// event's: a tie, which usable parameters win — a Checkout Session's metadata beside its
/// PaymentIntent's incomplete one, same second). An event that `restates` the payment
/// passes over a metadata error too: it is what an earlier attempt was judged by.
fn params_gap(event: &PaymentEvent, fixes: bool, restates: bool) -> Document {
    let open = if fixes {
        "$tokenParamsFixedBy"
    } else {
        "$tokenParams"
    };
    let open = doc! { "$eq": [ { "$ifNull": [open, Bson::Null] }, Bson::Null ] };
    if restates {
        return open;
    }
    doc! { "$and": [
        open,
        { "$or": [
            { "$eq": [ { "$ifNull": ["$metadataError", Bson::Null] }, Bson::Null ] },
            { "$eq": [ "$version", literal(event.version) ] },
        ] },
    ] }
}

/// Whether `event` is newer than the stored state (a payment without a version is older
/// than any event).
fn newer_than_stored(event: &PaymentEvent) -> Document {
    doc! { "$or": [
        { "$eq": [ { "$type": "$version" }, "missing" ] },
        { "$lt": [ "$version", literal(event.version) ] },
    ] }
}

/// Whether `gate` holds `event` back: a newer event from a status it may not move the
/// payment on from, when bound to fixed parameters one that names others, and when it
/// yields to captures one of a payment with a capture recorded.
fn held_back(event: &PaymentEvent, gate: &ProjectionGate<'_>, newer: Document) -> Document {
    let moves_from: Vec<&str> = gate.moves_from.iter().map(|s| s.as_str()).collect();
    let captured = doc! { "$gt": [ { "$size": { "$ifNull": ["$captures", []] } }, 0 ] };
    doc! { "$or": [
        { "$and": [
            newer,
            { "$not": [ { "$in": [
                { "$ifNull": ["$status", PaymentStatus::Processing.as_str()] },
                literal(moves_from),
            ] } ] },
        ] },
        { "$and": [ gate.bound_to_fixed_params, params_fixed(), names_other_params(event) ] },
        { "$and": [ gate.yields_to_captures, captured ] },
    ] }
}

/// Whether `event` names parameters other than the stored ones. Invalid ones name none:
/// other than any stored, the same as none fixed (an authorisation that named nothing
/// usable and fixed that).
fn names_other_params(event: &PaymentEvent) -> Bson {
    match &event.token_params {
        Some(Ok(params)) => doc! { "$not": [ { "$and": [
            { "$eq": ["$tokenParams.owner", literal(params.owner.object_id())] },
            { "$eq": ["$tokenParams.tokenType", literal(params.token_type.as_str())] },
            { "$eq": ["$tokenParams.quantity", literal(i64::from(params.quantity.get()))] },
        ] } ] }
        .into(),
        Some(Err(_)) => doc! {
            "$ne": [ { "$ifNull": ["$tokenParams", Bson::Null] }, Bson::Null ]
        }
        .into(),
        None => Bson::Boolean(false),
    }
}

impl Store {
    /// Applies `event` to its payment if it is newer than the stored state and `gate`
    /// lets it through; returns the state after the update either way (unchanged when the
    /// gate held the event back).
    pub async fn project_payment(
        &self,
        event: &PaymentEvent,
        gate: ProjectionGate<'_>,
    ) -> Result<PaymentDoc, StoreError> {
        let facts = event_facts(event, gate.fixes_params);
        let newer = newer_than_stored(event);
        // Decided once, on the stored document, before anything of it changes; the mark
        // is removed again at the end, so a held-back event leaves the document as it was.
        let mut pipeline = vec![
            doc! { "$set": { HELD_BACK: held_back(event, &gate, newer.clone()) } },
            doc! { "$replaceWith": { "$cond": [
                { "$or": [format!("${HELD_BACK}"), { "$not": [newer] }] },
                "$$ROOT",
                { "$mergeObjects": [ "$$ROOT", newer_sets(event, &facts) ] },
            ] } },
            // Runs after the gate: fills what is still missing.
            doc! { "$replaceWith": { "$cond": [
                format!("${HELD_BACK}"),
                "$$ROOT",
                { "$mergeObjects": [ "$$ROOT", gaps_filled(event, &facts, gate.restates) ] },
            ] } },
        ];
        if let Some(capture) = &event.capture {
            pipeline.extend(captured(capture));
        }
        pipeline.push(doc! { "$unset": HELD_BACK });
        self.upsert_payment(&event.key, pipeline).await
    }

    /// Records `refund` (of `amount`, when the event names the payment's amount) and
    /// nothing else about the payment: it neither moves the status nor consumes a version
    /// an older state event would then lose to. The payment keeps one amount per refund
    /// id in `refunds`, each only growing, and `amountRefunded` is their sum as recorded:
    /// two refunds add up, a redelivered or replayed one counts once. `amountRefunded`
    /// never shrinks, so a total recorded before `refunds` existed is kept (the money
    /// rule reads it as a floor, but where a Stripe release is named twice,
    /// `Money::gross`).
    ///
    /// A running total (`refund.reported_at`) leaves out the refunds that failed before
    /// it was reported (Stripe lowers a charge's `amount_refunded` when one fails): those
    /// recorded among `reversals` of this id before then are added back, so the entry
    /// stays the gross its reversals are taken from, and a later report neither counts a
    /// failed refund again nor misses a new one. The latest report is kept beside it
    /// (`reported`, `at`), for a failure recorded after it (`record_reversal`).
    pub async fn record_refund(
        &self,
        key: &PaymentKey,
        refund: &Refund,
        refund_amount: i64,
        amount: Option<i64>,
    ) -> Result<PaymentDoc, StoreError> {
        let id = literal(refund.id.as_str());
        let others = doc! { "$filter": {
            "input": { "$ifNull": ["$refunds", []] },
            "cond": { "$ne": ["$$this.id", id.clone()] },
        } };
        let known = doc! { "$max": { "$map": {
            "input": { "$filter": {
                "input": { "$ifNull": ["$refunds", []] },
                "cond": { "$eq": ["$$this.id", id.clone()] },
            } },
            "in": "$$this.amount",
        } } };
        let reported: Bson = match refund.reported_at {
            Some(at) => doc! { "$add": [ literal(refund_amount), { "$sum": { "$map": {
                "input": { "$filter": {
                    "input": { "$ifNull": ["$reversals", []] },
                    "cond": { "$and": [
                        { "$eq": ["$$this.of", id.clone()] },
                        { "$lt": [ { "$ifNull": ["$$this.at", at] }, literal(at) ] },
                    ] },
                } },
                "in": "$$this.amount",
            } } } ] }
            .into(),
            None => literal(refund_amount).into(),
        };
        let same_id = doc! { "$filter": {
            "input": { "$ifNull": ["$refunds", []] },
            "cond": { "$eq": ["$$this.id", id.clone()] },
        } };
        let existing = |field: &str| -> Document {
            doc! { "$first": { "$map": { "input": same_id.clone(), "in": format!("$$this.{field}") } } }
        };
        let full = refund.full == Some(true);
        let was_full = doc! { "$anyElementTrue": [ { "$map": {
            "input": { "$filter": {
                "input": { "$ifNull": ["$refunds", []] },
                "cond": { "$eq": ["$$this.id", id.clone()] },
            } },
            "in": { "$eq": ["$$this.full", true] },
        } } ] };
        let mut entry = doc! {
            "id": id,
            "amount": { "$max": [known, reported] },
            "full": { "$or": [literal(full), was_full] },
        };
        if let Some(at) = refund.reported_at {
            // The latest report wins; an older one only raises the gross above.
            let newer = doc! { "$or": [
                { "$eq": [ { "$ifNull": [existing("at"), Bson::Null] }, Bson::Null ] },
                { "$gte": [ literal(at), existing("at") ] },
            ] };
            entry.insert(
                "reported",
                doc! { "$cond": [newer.clone(), literal(refund_amount), existing("reported")] },
            );
            entry.insert("at", doc! { "$cond": [newer, literal(at), existing("at")] });
        }
        match (refund.release, refund.reported_at) {
            (Some(report), Some(at)) => {
                entry.insert("release", release_entry(&report, at, &existing));
            }
            // A report that says nothing of it keeps what the others said (absent when
            // they said nothing either: an absent field stays absent).
            _ => {
                let kept = doc! { "$getField": { "field": "release", "input": { "$first": same_id.clone() } } };
                entry.insert(
                    "release",
                    doc! { "$cond": [ { "$gt": [ { "$size": same_id.clone() }, 0 ] }, kept, "$$REMOVE" ] },
                );
            }
        }
        let mut set = doc! {
            "refunds": { "$concatArrays": [ others, [ entry ] ] },
            "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] },
            "updatedAt": "$$NOW",
            "moneyVersion": { "$add": [ { "$ifNull": ["$moneyVersion", 0_i64] }, 1_i64 ] },
        };
        if let Some(amount) = amount {
            set.insert("amount", doc! { "$ifNull": ["$amount", literal(amount)] });
        }
        let total = doc! { "$set": { "amountRefunded": { "$max": [
            { "$ifNull": ["$amountRefunded", 0_i64] },
            { "$sum": "$refunds.amount" },
        ] } } };
        self.upsert_payment(key, vec![doc! { "$set": set }, total])
            .await
    }

    /// Records `reversal` (money that came back) among the payment's `reversals`, one
    /// per id: its amount only grows and its `at` and `since` keep the earliest report,
    /// so a redelivered or replayed reversal counts once, whatever its unsigned fields
    /// say.
    /// Like a refund it moves no status and consumes no version.
    ///
    /// A reversal of a running total that its latest report already left out (it is
    /// older than the report: a failure delivered after the next report of its charge)
    /// is added back to that total's gross, as `record_refund` does for one it knows.
    pub async fn record_reversal(
        &self,
        key: &PaymentKey,
        reversal: &Reversal,
    ) -> Result<PaymentDoc, StoreError> {
        let id = literal(reversal.id.as_str());
        let same = |input: &str| {
            doc! { "$filter": {
                "input": { "$ifNull": [input, []] },
                "cond": { "$eq": ["$$this.id", id.clone()] },
            } }
        };
        let others = doc! { "$filter": {
            "input": { "$ifNull": ["$reversals", []] },
            "cond": { "$ne": ["$$this.id", id.clone()] },
        } };
        let known = |field: &str| {
            doc! { "$max": { "$map": { "input": same("$reversals"), "in": format!("$$this.{field}") } } }
        };
        let earliest = |field: &str, value: Option<i64>| -> Bson {
            let known = doc! { "$min": { "$map": { "input": same("$reversals"), "in": format!("$$this.{field}") } } };
            match value {
                Some(value) => {
                    doc! { "$ifNull": [ { "$min": [known, literal(value)] }, literal(value) ] }
                        .into()
                }
                None => known.into(),
            }
        };
        let of: Bson = match &reversal.of {
            Some(of) => literal(of.as_str()).into(),
            None => Bson::Null,
        };
        let set = doc! {
            "reversals": { "$concatArrays": [
                others,
                [ {
                    "id": literal(reversal.id.as_str()),
                    "amount": { "$max": [known("amount"), literal(reversal.amount)] },
                    "of": of,
                    "at": earliest("at", reversal.at),
                    "since": earliest("since", reversal.since),
                } ],
            ] },
            "createdAt": { "$ifNull": ["$createdAt", "$$NOW"] },
            "updatedAt": "$$NOW",
            "moneyVersion": { "$add": [ { "$ifNull": ["$moneyVersion", 0_i64] }, 1_i64 ] },
        };
        let mut pipeline = vec![doc! { "$set": set }];
        if let Some(of) = &reversal.of {
            let older_reversals = doc! { "$sum": { "$map": {
                "input": { "$filter": {
                    "input": "$reversals",
                    "as": "v",
                    "cond": { "$and": [
                        { "$eq": ["$$v.of", "$$r.id"] },
                        { "$lt": [ { "$ifNull": ["$$v.at", "$$r.at"] }, "$$r.at" ] },
                    ] },
                } },
                "as": "v",
                "in": "$$v.amount",
            } } };
            let regrossed = doc! { "$mergeObjects": [ "$$r", { "amount": { "$max": [
                "$$r.amount",
                { "$add": ["$$r.reported", older_reversals] },
            ] } } ] };
            let reported_total = doc! { "$and": [
                { "$eq": ["$$r.id", literal(of.as_str())] },
                { "$ne": [ { "$ifNull": ["$$r.at", Bson::Null] }, Bson::Null ] },
                { "$ne": [ { "$ifNull": ["$$r.reported", Bson::Null] }, Bson::Null ] },
            ] };
            pipeline.push(doc! { "$set": { "refunds": { "$map": {
                "input": { "$ifNull": ["$refunds", []] },
                "as": "r",
                "in": { "$cond": [reported_total, regrossed, "$$r"] },
            } } } });
            pipeline.push(doc! { "$set": { "amountRefunded": { "$max": [
                { "$ifNull": ["$amountRefunded", 0_i64] },
                { "$sum": "$refunds.amount" },
            ] } } });
        }
        self.upsert_payment(key, pipeline).await
    }

    /// Moves `read` (the payment as read) from its status to `to` if it is still at
    /// that status, version and money (`moneyVersion`): an event projected or money
    /// recorded meanwhile wins, and the caller decides again on the state returned. The
    /// version stays, so an older event still loses to it, and `event` is recorded as
    /// the last. Returns the payment as it now is.
    pub async fn move_status(
        &self,
        read: &PaymentDoc,
        to: PaymentStatus,
        event: &PaymentEvent,
    ) -> Result<Option<PaymentDoc>, StoreError> {
        let key = read.key()?;
        let filter = as_read(read)?;
        self.collection(PAYMENTS)
            .update_one(
                filter,
                doc! { "$set": {
                    "status": to.as_str(),
                    "lastEventId": event.event_id.as_str(),
                    "lastEventType": event.event_type.as_str(),
                    "updatedAt": DateTime::now(),
                } },
            )
            .await?;
        self.find_payment(&key).await
    }

    /// Runs `pipeline` as an upsert on the payment's document; returns it as it now is.
    async fn upsert_payment(
        &self,
        key: &PaymentKey,
        pipeline: Vec<Document>,
    ) -> Result<PaymentDoc, StoreError> {
        let state = self
            .upsert_one(
                PAYMENTS,
                PAYMENTS_INDEX,
                issuance_filter(key),
                pipeline,
                ReturnDocument::After,
            )
            .await?
            .ok_or_else(|| StoreError::Internal("payment upsert returned nothing".to_owned()))?;
        from_document(state)
    }

    pub async fn find_payment(&self, key: &PaymentKey) -> Result<Option<PaymentDoc>, StoreError> {
        let found = self
            .collection(PAYMENTS)
            .find_one(issuance_filter(key))
            .await?;
        found.map(from_document).transpose()
    }

    /// Takes back the share of a payment's set of `quantity` tokens it no longer stands
    /// for (all but `kept`): the active tokens from the boundary `domain::share_taken`
    /// draws by the tokens spent, and every active token outside the set (a payment
    /// without a set, `quantity` 0, has none in it). Redeemed ones stay redeemed; what of
    /// the share no unspent token is left for is the shortfall.
    ///
    /// Each token is written only while `active` and gets `$inc: {_version: 1}`, so a
    /// concurrent version-gated redeem either happened first (and is kept) or sees the
    /// new version. Only spending moves the boundary, and only down: a token of the share
    /// spent between the read and the write is found by the next read, and the share is
    /// taken again from the lower boundary, until a read finds it where it was. A payment
    /// whose tokens are spent under every pass is `Contended`: answered 5xx, its settle
    /// runs again (the provider's redelivery, self-repair). Returns (revoked now,
    /// shortfall).
    pub async fn revoke_share(
        &self,
        key: &PaymentKey,
        quantity: i64,
        kept: i64,
        reason: RevocationReason,
        by: &Actor,
    ) -> Result<(u64, u64), StoreError> {
        const PASSES: usize = 4;
        let mut taken = self.share_boundary(key, quantity, kept).await?;
        let mut revoked = 0;
        for _ in 0..PASSES {
            let share = RevokedShare {
                from: taken.from,
                reason,
                by: by.clone(),
            };
            revoked += self
                .collection(TOKENS)
                .update_many(
                    active_from_filter(key, share.from),
                    share.revoke(DateTime::now()),
                )
                .await?
                .modified_count;
            let again = self.share_boundary(key, quantity, kept).await?;
            if again == taken {
                return Ok((revoked, taken.shortfall));
            }
            taken = again;
        }
        Err(StoreError::Contended(mongodb::error::Error::custom(
            "the payment's tokens were spent under every pass of its settle",
        )))
    }

    /// Where the share of a payment's set of `quantity` that it no longer stands for (all
    /// but `kept`) begins (`domain::share_taken`), by the tokens of the set spent. A
    /// payment that stands for all of its set takes nothing back wherever tokens were
    /// spent: its boundary is read from nothing (every fresh settle of a standing
    /// payment asks, on its way to bringing tokens back).
    async fn share_boundary(
        &self,
        key: &PaymentKey,
        quantity: i64,
        kept: i64,
    ) -> Result<ShareTaken, StoreError> {
        if kept >= quantity {
            return Ok(share_taken(quantity, kept, &[]));
        }
        let mut filter = payment_tokens_filter(key);
        filter.insert("tokenIndex", doc! { "$lt": quantity });
        filter.insert("status", "redeemed");
        let rows: Vec<Document> = self
            .collection(TOKENS)
            .find(filter)
            .projection(doc! { "_id": 0, "tokenIndex": 1 })
            .await?
            .try_collect()
            .await?;
        let spent: Vec<i64> = rows.iter().filter_map(token_index).collect();
        Ok(share_taken(quantity, kept, &spent))
    }

    /// Makes active again the tokens of a payment's set of `quantity` that its
    /// withdrawals revoked and that the share it no longer stands for by `read` (all but
    /// `kept`) does not take: below the boundary `domain::share_taken` draws, whose last
    /// author is `by`, the payment's provider (a payment's settle is the only writer that
    /// names it, so an operator's revoke, by `key:…`, is never undone, nor a token revoked
    /// before authors were recorded). `None`: the payment is no longer as read (money or
    /// a state was recorded since), nothing was written, and the caller decides again by
    /// a fresh read.
    ///
    /// Why a transaction: the tokens come back by `read`, and a withdrawal recorded
    /// after it takes some of them back. The transaction first writes the payment's
    /// document, only while it is still as read ([`as_read`]), then the tokens, and
    /// commits both or neither: a withdrawal recorded before the commit either makes the
    /// payment no longer match (nothing comes back) or write-conflicts with it (retried,
    /// then it no longer matches), and one recorded after the commit finds the tokens
    /// active and its own settle takes them back. Each token is written only at the
    /// version it was read at and still revoked by `by`, and gets `$inc: {_version: 1}`;
    /// all in one `update_many`. Returns how many came back.
    ///
    /// A deployment without transactions (a standalone server) writes the tokens alone:
    /// a withdrawal recorded between the read and the write leaves them active until
    /// its own settle, which runs after recording it, takes them back.
    pub async fn reactivate_tokens(
        &self,
        read: &PaymentDoc,
        quantity: i64,
        kept: i64,
        by: &Actor,
    ) -> Result<Option<u64>, StoreError> {
        let key = read.key()?;
        let taken = self.share_boundary(&key, quantity, kept).await?;
        let mut filter = payment_tokens_filter(&key);
        filter.insert("tokenIndex", doc! { "$lt": taken.from });
        filter.insert("status", "revoked");
        filter.insert("lastChangedBy", by.as_str());
        let candidates: Vec<Document> = self
            .collection(TOKENS)
            .find(filter.clone())
            .projection(doc! { "_id": 1, "_version": 1 })
            .await?
            .try_collect()
            .await?;
        let gates: Vec<Document> = candidates
            .iter()
            .filter_map(|token| match (token.get("_id"), token.get("_version")) {
                (Some(id), Some(version)) => Some(doc! { "_id": id, "_version": version }),
                _ => None,
            })
            .collect();
        if gates.is_empty() {
            return Ok(Some(0));
        }
        filter.insert("$or", gates);
        let now = DateTime::now();
        let update = doc! {
            "$set": { "status": "active", "reactivatedAt": now, "updatedAt": now },
            "$unset": { "revokedAt": "", "revocationReason": "" },
            "$inc": { "_version": 1 },
        };
        if !self.supports_transactions().await? {
            let written = self.collection(TOKENS).update_many(filter, update).await?;
            return Ok(Some(written.modified_count));
        }
        let mut session = self.client.start_session().await?;
        let mut attempt = 1;
        loop {
            match self
                .reactivate_in_transaction(&mut session, read, &filter, &update)
                .await
            {
                Err(err)
                    if is_transient_transaction_error(&err)
                        && retry::TRANSACTION.allows_another(attempt) =>
                {
                    attempt += 1;
                    pause_before_transaction(attempt).await;
                }
                Err(err) if is_transient_transaction_error(&err) => {
                    return Err(transaction_gave_up(err));
                }
                other => return Ok(other?),
            }
        }
    }

    /// One attempt of [`Store::reactivate_tokens`]' transaction; aborted unless committed.
    async fn reactivate_in_transaction(
        &self,
        session: &mut ClientSession,
        read: &PaymentDoc,
        tokens: &Document,
        update: &Document,
    ) -> Result<Option<u64>, mongodb::error::Error> {
        start_snapshot_transaction(session).await?;
        let written = self.write_reactivation(session, read, tokens, update).await;
        if !matches!(written, Ok(Some(_))) {
            abort_quietly(session).await;
        }
        written
    }

    async fn write_reactivation(
        &self,
        session: &mut ClientSession,
        read: &PaymentDoc,
        tokens: &Document,
        update: &Document,
    ) -> Result<Option<u64>, mongodb::error::Error> {
        let filter = as_read(read).map_err(|e| mongodb::error::Error::custom(e.to_string()))?;
        // A write, not a read: only a write conflicts with a concurrent one.
        let held = self
            .collection(PAYMENTS)
            .update_one(filter, doc! { "$inc": { "reactivations": 1_i64 } })
            .session(&mut *session)
            .await?;
        if held.matched_count == 0 {
            return Ok(None);
        }
        let reactivated = self
            .collection(TOKENS)
            .update_many(tokens.clone(), update.clone())
            .session(&mut *session)
            .await?
            .modified_count;
        commit_with_retry(session).await?;
        Ok(Some(reactivated))
    }
}

/// The filter matching `read`'s payment only while it is still as read: at its status,
/// version and money (`moneyVersion`), each missing field read as [`PaymentDoc`] reads it
/// (a payment heard of only through a refund has no status nor version yet).
fn as_read(read: &PaymentDoc) -> Result<Document, StoreError> {
    let mut filter = issuance_filter(&read.key()?);
    filter.insert(
        "$expr",
        doc! { "$and": [
            { "$eq": [
                { "$ifNull": ["$status", PaymentStatus::Processing.as_str()] },
                literal(read.status.as_str()),
            ] },
            { "$eq": [ { "$ifNull": ["$version", 0_i64] }, literal(read.version) ] },
            { "$eq": [ { "$ifNull": ["$moneyVersion", 0_i64] }, literal(read.money_version) ] },
        ] },
    );
    Ok(filter)
}
