//! Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=…]`, HMAC-SHA256 of
//! `"{ts}:{raw body}"` keyed with the notification destination's secret key exactly as
//! Paddle shows it (`pdl_ntfset_…`), and its events: transactions, and the adjustments
//! that take money back (approved refunds and chargebacks).

use chrono::DateTime;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::events::{EventError, integer, payment_key, ranked_version, text, tokenmint_params};
use super::signing::{PrefixedSecret, TimestampedHeader};
use crate::domain::{
    PaidItem, ParsedEvent, PaymentEvent, PaymentStatus, Provider, Refund, Reversal, TokenPacks,
    TokensBought,
};
use crate::settings::WebhookScheme;

/// Paddle: `Paddle-Signature: ts=<unix>;h1=<hex>`, HMAC of `"{ts}:{body}"` keyed with the
/// secret key as Paddle shows it: `pdl_ntfset_` and at least 16 visible characters (an
/// id and a key). Any `h1` under any configured secret counts (several in a rotation).
pub(super) const SCHEME: TimestampedHeader = TimestampedHeader {
    timestamp: "ts",
    signature: "h1",
    items: ';',
    separator: b":",
    secret: PrefixedSecret {
        prefix: "pdl_ntfset_",
        min_chars: 16,
        problem: "must be Paddle's notification secret key: `pdl_ntfset_` followed by at least 16 visible ASCII characters, without spaces",
    },
};

/// Signs like Paddle does: the `Paddle-Signature` value; for tests and `webhooks sign`.
pub fn sign_paddle(secret: &str, timestamp: i64, body: &[u8]) -> String {
    SCHEME.sign(secret, timestamp, body)
}

/// Whether an adjustment of `action` in `status` takes money back (a refund or a
/// chargeback, both read the same way from there on), or why not.
///
/// Paddle reviews refunds: they are created `pending_approval` and move to `approved` or
/// `rejected` (`adjustment.updated`), so only an approved one counts. Paddle creates a
/// chargeback itself once the customer's dispute has succeeded, with no review: it
/// counts as soon as it is reported, unless its status says it does not stand
/// (`rejected`, or `reversed` once Paddle won the money back).
///
/// `Ok(Moved::Back)` is a `chargeback_reverse`: Paddle won the dispute and the money came
/// back. Like a chargeback it needs no review, so it counts unless `rejected`.
fn money_moved(action: Option<&str>, status: Option<&str>) -> Result<Moved, String> {
    let status_word = status.unwrap_or("missing");
    match action {
        Some("refund") if status == Some("approved") => Ok(Moved::Out),
        Some("refund") => Err(format!("refund not approved (status {status_word})")),
        Some("chargeback") => match status {
            Some(status @ ("rejected" | "reversed")) => Err(format!("chargeback {status}")),
            _ => Ok(Moved::Out),
        },
        Some("chargeback_reverse") => match status {
            Some("rejected") => Err("chargeback reversal rejected".to_owned()),
            _ => Ok(Moved::Back),
        },
        Some("chargeback_warning") => {
            Err("a chargeback warning takes no money back (a chargeback would)".to_owned())
        }
        Some(other) => Err(format!("a {other} adjustment takes no money back")),
        None => Err("adjustment without an action".to_owned()),
    }
}

/// Which way an adjustment moves the payment's money.
enum Moved {
    /// Back to the customer: a refund or chargeback.
    Out,
    /// Back to the merchant: a chargeback reversed.
    Back,
}

#[derive(Deserialize)]
struct PaddleEvent {
    event_id: String,
    event_type: String,
    occurred_at: String,
    #[serde(default)]
    notification_id: Option<String>,
    data: Map<String, Value>,
}

/// How the ids of Paddle's webhook simulator begin: its events (`ntfsimevt_…`) and their
/// notifications (`ntfsimntf_…`), where real ones are `evt_…` and `ntf_…`.
const SIMULATED_EVENT: &str = "ntfsimevt_";
const SIMULATED_NOTIFICATION: &str = "ntfsimntf_";

/// Parses a Paddle event (`{event_id, event_type, occurred_at, data}`). Every payment is
/// at account `default`; its id is the transaction id. A transaction's items are read
/// through the provider's `packs`, when it has any.
pub fn parse_paddle(
    provider: &Provider,
    body: &[u8],
    max_quantity: u32,
    packs: &TokenPacks,
) -> Result<ParsedEvent, EventError> {
    let event: PaddleEvent =
        serde_json::from_slice(body).map_err(|e| EventError(format!("not a Paddle event: {e}")))?;
    let occurred = DateTime::parse_from_rfc3339(&event.occurred_at)
        .map_err(|e| EventError(format!("not a Paddle event: occurred_at: {e}")))?
        .to_utc();
    let ignored = |reason: &str| {
        Ok(ParsedEvent::Ignored {
            event_id: event.event_id.clone(),
            event_type: event.event_type.clone(),
            reason: reason.to_owned(),
        })
    };
    // The simulator signs with the destination's secret key whatever payload its user
    // wrote, real transaction ids included: such an event proves no money moved, and it
    // must neither issue tokens nor take real ones back. Only a destination that takes
    // simulated traffic receives it.
    let simulated = event.event_id.starts_with(SIMULATED_EVENT)
        || event
            .notification_id
            .as_deref()
            .is_some_and(|id| id.starts_with(SIMULATED_NOTIFICATION));
    if simulated {
        return ignored("a webhook simulator event: no money moved");
    }
    let data = &event.data;
    let (status, payment_id, reverses) = match status_and_payment(&event.event_type, data) {
        Ok(reported) => reported,
        Err(reason) => return ignored(&reason),
    };
    let Some(key) = payment_key(provider, "default", payment_id) else {
        return ignored("invalid transaction id");
    };
    let Some(version) = ranked_version(status.rank(), occurred.timestamp()) else {
        return Err(EventError(
            "not a Paddle event: occurred_at is out of range".to_owned(),
        ));
    };
    let reversal = match reversal(data, reverses, occurred.timestamp()) {
        Ok(reversal) => reversal,
        Err(reason) => return ignored(reason),
    };
    Ok(ParsedEvent::Payment(Box::new(PaymentEvent {
        event_id: event.event_id.clone(),
        event_type: event.event_type.clone(),
        key,
        status,
        version,
        // An adjustment's total is the refund's, not the transaction's.
        amount: (status != PaymentStatus::Refunded && !reverses)
            .then(|| minor_units(data, &["details", "totals", "grand_total"]))
            .flatten(),
        currency: text(data, "currency_code").map(str::to_owned),
        token_params: data
            .get("custom_data")
            .and_then(Value::as_object)
            .and_then(|custom| tokenmint_params(custom, "", max_quantity)),
        payment_date: (status == PaymentStatus::Succeeded).then_some(occurred),
        refund: (status == PaymentStatus::Refunded).then(|| refund(data)),
        reversal,
        capture: None,
        uncaptured: None,
        authorises_capture: false,
        sole_metadata: false,
        customer_metadata: WebhookScheme::Paddle.customer_writes_metadata(),
        bought: (!packs.is_empty() && event.event_type.starts_with("transaction."))
            .then(|| bought(data, packs)),
    })))
}

/// What a transaction's `items` bought through `packs`: each item's price (`price.id`, or
/// `price_id`), its `quantity` (an integer, read from a string of digits too) and whether
/// it is prorated (`proration` set). An item is charged whatever can be read of it: one
/// without a readable quantity buys nothing, and one without a price id is a price that
/// is no pack.
fn bought(transaction: &Map<String, Value>, packs: &TokenPacks) -> TokensBought {
    let items = transaction.get("items").and_then(Value::as_array);
    packs.bought(items.into_iter().flatten().map(|item| {
        PaidItem {
            price: item
                .pointer("/price/id")
                .or_else(|| item.get("price_id"))
                .and_then(Value::as_str)
                .unwrap_or("an item without a price id"),
            units: item.get("quantity").and_then(integer).unwrap_or(0),
            prorated: !item.get("proration").unwrap_or(&Value::Null).is_null(),
        }
    }))
}

/// The status an event of `event_type` reports, the transaction it is about, and whether
/// it gives money back to the merchant; `Err`: why it reports none.
fn status_and_payment<'a>(
    event_type: &str,
    data: &'a Map<String, Value>,
) -> Result<(PaymentStatus, Option<&'a str>, bool), String> {
    let id = |field: &str| text(data, field);
    Ok(match event_type {
        "transaction.completed" => (PaymentStatus::Succeeded, id("id"), false),
        "transaction.payment_failed" => (PaymentStatus::Failed, id("id"), false),
        "transaction.canceled" => (PaymentStatus::Canceled, id("id"), false),
        "adjustment.created" | "adjustment.updated" => {
            match money_moved(id("action"), id("status"))? {
                // A refund of the tax alone (a business customer's VAT id added after
                // the purchase): Paddle, the merchant of record, gives back tax it
                // collected, and what the tokens were sold for stands.
                Moved::Out
                    if id("action") == Some("refund")
                        && minor_units(data, &["totals", "subtotal"]) == Some(0) =>
                {
                    return Err(
                        "a refund of tax alone: what the tokens were sold for stands".to_owned(),
                    );
                }
                Moved::Out => (PaymentStatus::Refunded, id("transaction_id"), false),
                // Money coming back moves no state: the money decides.
                Moved::Back => (PaymentStatus::Succeeded, id("transaction_id"), true),
            }
        }
        _ => return Err("unhandled event type".to_owned()),
    })
}

/// The refund an adjustment that takes money back reports. A chargeback's id says its
/// kind (`chargeback:`), which a reversal, naming no chargeback, is matched by.
fn refund(adjustment: &Map<String, Value>) -> Refund {
    let kind = match text(adjustment, "action") {
        Some("chargeback") => "chargeback",
        _ => "adjustment",
    };
    Refund {
        id: format!("{kind}:{}", text(adjustment, "id").unwrap_or_default()),
        amount: minor_units(adjustment, &["totals", "total"]),
        full: match text(adjustment, "type") {
            Some("full") => Some(true),
            Some("partial") => Some(false),
            _ => None,
        },
        reported_at: None,
        release: None,
    }
}

/// Paddle's reversal is an adjustment of its own, naming no chargeback: it gives back
/// its total, once (by its own id), against the payment's chargebacks only (`of:
/// None`), never against a refund. `None` unless the event `reverses`.
fn reversal(
    adjustment: &Map<String, Value>,
    reverses: bool,
    occurred_secs: i64,
) -> Result<Option<Reversal>, &'static str> {
    if !reverses {
        return Ok(None);
    }
    let amount = minor_units(adjustment, &["totals", "total"])
        .ok_or("chargeback reversal without totals.total")?;
    Ok(Some(Reversal {
        id: format!("adjustment:{}", text(adjustment, "id").unwrap_or_default()),
        amount,
        of: None,
        at: Some(occurred_secs),
        since: None,
    }))
}

/// The amount at `path` in `data`: Paddle amounts are strings of minor units (`"1100"`),
/// a JSON integer read too.
fn minor_units(data: &Map<String, Value>, path: &[&str]) -> Option<i64> {
    let (first, rest) = path.split_first()?;
    let value = rest
        .iter()
        .try_fold(data.get(*first)?, |value, field| value.get(field))?;
    integer(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::webhooks::signing::{SignatureError, verify_with};

    /// The secret key of Paddle's own example in its signature-verification guide.
    const DOCS_SECRET: &str = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_a7e4a56cf7c1cd80cb1c735c72bab2aa75d06fe08b8c50a18cf6afbcfe834122";
    const NOW: i64 = 1_671_552_777;

    fn verify_header(
        header: Option<&str>,
        body: &[u8],
        keys: &[&str],
        now: i64,
    ) -> Result<(), SignatureError> {
        verify_with(keys, 5, now, |check| SCHEME.verify(header, body, check))
    }

    fn verify(header: &str, body: &[u8], keys: &[&str], now: i64) -> Result<(), SignatureError> {
        verify_header(Some(header), body, keys, now)
    }

    #[test]
    fn known_answer_of_the_documented_procedure() {
        // HMAC-SHA256 of "1671552777:{body}" under the documented key, computed by an
        // independent implementation (Python's hmac) of Paddle's published procedure.
        let body = br#"{"event_id":"evt_01h8bzakzx3hm2fmen703n5q45","event_type":"transaction.completed"}"#;
        let header =
            "ts=1671552777;h1=aae40acb8345627ed55eca861989b9eebd238171302ed8566eb7e9231be39ba6";
        assert_eq!(sign_paddle(DOCS_SECRET, NOW, body), header);
        assert_eq!(verify(header, body, &[DOCS_SECRET], NOW), Ok(()));
    }

    #[test]
    fn rotation_tolerance_and_refusals() {
        let old = "pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms8_oldoldoldoldold0";
        let body = br#"{"event_id":"evt_1"}"#;
        let signed = sign_paddle(DOCS_SECRET, NOW, body);
        assert_eq!(verify(&signed, body, &[old, DOCS_SECRET], NOW), Ok(()));
        let h1 = signed.split(";h1=").nth(1).unwrap();
        let two = format!("ts={NOW};h1={};h1={h1}", "00".repeat(32));
        assert_eq!(verify(&two, body, &[DOCS_SECRET], NOW), Ok(()));
        assert_eq!(
            verify(&signed, b"{}", &[DOCS_SECRET], NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify(&signed, body, &[old], NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify(&signed, body, &[DOCS_SECRET], NOW + 6),
            Err(SignatureError::OutOfTolerance)
        );
        assert_eq!(
            verify(&signed, body, &[DOCS_SECRET], NOW - 6),
            Err(SignatureError::OutOfTolerance)
        );
        for garbage in ["", "h1=00", "ts=x;h1=00", &format!("ts={NOW}")] {
            assert_eq!(
                verify(garbage, body, &[DOCS_SECRET], NOW),
                Err(SignatureError::Invalid),
                "{garbage:?}"
            );
        }
        assert_eq!(
            verify_header(None, body, &[DOCS_SECRET], NOW),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn secrets_must_look_like_paddle_keys() {
        assert_eq!(SCHEME.secret.check(DOCS_SECRET), Ok(()));
        for secret in [
            "whsec_0123456789abcdef0123",
            "pdl_ntfset_short",
            "pdl_ntfset_0123456789 abcdef",
            "",
        ] {
            let problem = SCHEME.secret.check(secret).unwrap_err();
            assert!(secret.is_empty() || !problem.contains(secret), "{secret}");
        }
    }

    fn no_packs() -> TokenPacks {
        TokenPacks::default()
    }

    fn parse(event: &Value) -> PaymentEvent {
        let provider = Provider::parse("paddle").unwrap();
        match parse_paddle(&provider, event.to_string().as_bytes(), 100, &no_packs()).unwrap() {
            ParsedEvent::Payment(event) => *event,
            ignored => panic!("{ignored:?}"),
        }
    }

    #[test]
    fn transactions_and_refund_adjustments() {
        let completed = parse(&json!({
            "event_id": "evt_1", "event_type": "transaction.completed",
            "occurred_at": "2026-11-30T10:00:00.123456Z",
            "data": { "id": "txn_1", "status": "completed", "currency_code": "EUR",
                "details": { "totals": { "grand_total": "1100" } },
                "custom_data": { "tokenmint_owner": "65f1a0c2b3d4e5f601234567",
                    "tokenmint_token_type": "standard", "tokenmint_quantity": 4 } }
        }));
        assert_eq!(completed.status, PaymentStatus::Succeeded);
        assert_eq!(completed.amount, Some(1100));
        assert_eq!(completed.token_params.unwrap().unwrap().quantity.get(), 4);
        let refund = parse(&json!({
            "event_id": "evt_2", "event_type": "adjustment.updated",
            "occurred_at": "2026-11-30T09:00:00Z",
            "data": { "id": "adj_1", "action": "refund", "status": "approved", "type": "partial",
                "transaction_id": "txn_1", "totals": { "total": "275" } }
        }));
        assert_eq!(refund.key.payment_intent_id.as_str(), "txn_1");
        assert_eq!(
            refund.amount, None,
            "the adjustment's total is the refund's"
        );
        assert_eq!(
            refund.refund,
            Some(Refund {
                id: "adjustment:adj_1".to_owned(),
                amount: Some(275),
                full: Some(false),
                reported_at: None,
                release: None,
            })
        );
        assert!(
            refund.version > completed.version,
            "a refund outranks the success, earlier or not"
        );
        let pending = json!({ "event_id": "evt_3", "event_type": "adjustment.created",
            "occurred_at": "2026-11-30T09:00:00Z",
            "data": { "id": "adj_2", "action": "refund", "status": "pending_approval", "transaction_id": "txn_1" } });
        let provider = Provider::parse("paddle").unwrap();
        assert!(matches!(
            parse_paddle(&provider, pending.to_string().as_bytes(), 100, &no_packs()).unwrap(),
            ParsedEvent::Ignored { .. }
        ));
        assert!(parse_paddle(&provider, b"{}", 100, &no_packs()).is_err());
    }

    #[test]
    fn a_transactions_items_are_read_through_the_packs() {
        let packs: TokenPacks = serde_json::from_value(
            json!({ "pri_ten": { "token_type": "standard", "quantity": 10 } }),
        )
        .unwrap();
        let completed = json!({
            "event_id": "evt_1", "event_type": "transaction.completed",
            "occurred_at": "2026-11-30T10:00:00Z",
            "data": { "id": "txn_1", "status": "completed", "currency_code": "EUR",
                "details": { "totals": { "grand_total": "3000" } },
                // Paddle names the price in `price.id`; `price_id` is read as well.
                "items": [ { "price": { "id": "pri_ten" }, "quantity": 2 },
                    { "price_id": "pri_ten", "quantity": 1 },
                    { "price": { "id": "pri_ten" }, "quantity": "4" },
                    { "price": { "id": "pri_ten" }, "quantity": 1.5 } ],
                "custom_data": { "tokenmint_owner": "65f1a0c2b3d4e5f601234567",
                    "tokenmint_token_type": "standard", "tokenmint_quantity": 70 } }
        });
        let provider = Provider::parse("paddle").unwrap();
        let ParsedEvent::Payment(event) =
            parse_paddle(&provider, completed.to_string().as_bytes(), 100, &packs).unwrap()
        else {
            panic!("a payment event");
        };
        let params = event.token_params.clone().unwrap().unwrap();
        let bought = event.bought.expect("read through the packs");
        assert_eq!(bought.short_of(&params), None, "seventy bought");
        let mut more = params.clone();
        more.quantity = crate::domain::Quantity::from_i64(71, 100).unwrap();
        assert!(bought.short_of(&more).is_some(), "a fraction buys nothing");
        // Whatever else is charged, readable or not, is no pack.
        for other in [
            json!({ "price": { "id": "pri_plan" }, "quantity": 1 }),
            json!({ "quantity": 1 }),
        ] {
            let mut mixed = completed.clone();
            mixed["data"]["items"]
                .as_array_mut()
                .unwrap()
                .push(other.clone());
            let ParsedEvent::Payment(event) =
                parse_paddle(&provider, mixed.to_string().as_bytes(), 100, &packs).unwrap()
            else {
                panic!("a payment event");
            };
            assert!(event.bought.unwrap().short_of(&params).is_some(), "{other}");
        }
        assert_eq!(parse(&completed).bought, None, "no packs: items unread");
    }

    /// A Paddle adjustment of `action` and `status`, `type` `kind`, of 400 of `txn_1`.
    fn adjustment(action: &str, status: &str, kind: &str) -> Value {
        json!({ "event_id": "evt_cb", "event_type": "adjustment.created",
            "occurred_at": "2026-11-30T12:00:00Z",
            "data": { "id": "adj_cb", "action": action, "status": status, "type": kind,
                "transaction_id": "txn_1", "totals": { "total": "400" } } })
    }

    fn ignored_reason(event: &Value) -> String {
        let provider = Provider::parse("paddle").unwrap();
        match parse_paddle(&provider, event.to_string().as_bytes(), 100, &no_packs()).unwrap() {
            ParsedEvent::Ignored { reason, .. } => reason,
            payment => panic!("{payment:?}"),
        }
    }

    #[test]
    fn chargebacks_are_withdrawals_like_refunds() {
        for (kind, full) in [("full", true), ("partial", false)] {
            let chargeback = parse(&adjustment("chargeback", "approved", kind));
            assert_eq!(chargeback.status, PaymentStatus::Refunded, "{kind}");
            assert_eq!(chargeback.key.payment_intent_id.as_str(), "txn_1");
            assert_eq!(chargeback.amount, None, "the total is the chargeback's");
            assert_eq!(
                chargeback.refund,
                Some(Refund {
                    id: "chargeback:adj_cb".to_owned(),
                    amount: Some(400),
                    full: Some(full),
                    reported_at: None,
                    release: None,
                }),
                "{kind}"
            );
        }
        // Paddle reviews refunds, not chargebacks: a chargeback counts unless its status
        // says it does not stand.
        assert!(
            parse(&adjustment("chargeback", "pending_approval", "full"))
                .refund
                .is_some()
        );
        for status in ["rejected", "reversed"] {
            let reason = ignored_reason(&adjustment("chargeback", status, "full"));
            assert!(reason.contains(status), "{status}: {reason}");
        }
    }

    #[test]
    fn chargeback_warnings_are_ignored_and_reversals_give_money_back() {
        let warning = ignored_reason(&adjustment("chargeback_warning", "approved", "full"));
        assert!(warning.contains("warning"), "{warning}");
        let reverse = parse(&adjustment("chargeback_reverse", "approved", "full"));
        assert_eq!(reverse.refund, None);
        assert_eq!(reverse.amount, None, "the total is the reversal's");
        assert_eq!(
            reverse.reversal,
            Some(Reversal {
                id: "adjustment:adj_cb".to_owned(),
                amount: 400,
                of: None,
                at: Some(1_796_040_000),
                since: None,
            })
        );
        let rejected = ignored_reason(&adjustment("chargeback_reverse", "rejected", "full"));
        assert!(rejected.contains("rejected"), "{rejected}");
        let credit = ignored_reason(&adjustment("credit", "approved", "full"));
        assert!(credit.contains("credit"), "{credit}");
        let pending = ignored_reason(&adjustment("refund", "pending_approval", "full"));
        assert!(pending.contains("pending_approval"), "{pending}");
    }
}
