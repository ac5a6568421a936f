//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 of
//! `"{t}.{raw body}"` keyed with the whole secret string, and its events: PaymentIntents,
//! the Checkout Sessions that report them, refunded charges, disputes whose funds were
//! withdrawn (chargebacks) or reinstated, and refunds that failed or were canceled.

use chrono::DateTime;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::events::{EventError, EventTime, payment_key, text, tokenmint_params};
use super::signing::{PrefixedSecret, TimestampedHeader};
use crate::domain::{
    IssuanceParams, ParsedEvent, PaymentEvent, PaymentStatus, Provider, Refund, ReleaseReport,
    Reversal, UNCAPTURED_KIND,
};

/// The fewest characters a Stripe secret has after `whsec_`.
pub const STRIPE_SECRET_MIN_CHARS: usize = 16;

/// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`, HMAC of `"{t}.{body}"` keyed
/// with the whole secret string, a secret being `whsec_` and at least 16 visible
/// characters. Only `v1` counts; `v0` and unknown schemes are ignored.
pub(super) const SCHEME: TimestampedHeader = TimestampedHeader {
    timestamp: "t",
    signature: "v1",
    items: ',',
    separator: b".",
    secret: PrefixedSecret {
        prefix: "whsec_",
        min_chars: STRIPE_SECRET_MIN_CHARS,
        problem: "must be `whsec_` followed by at least 16 visible ASCII characters, without spaces",
    },
};

/// Signs like Stripe does; for tests and `webhooks sign`.
pub fn sign_stripe(secret: &str, timestamp: i64, body: &[u8]) -> String {
    SCHEME.sign(secret, timestamp, body)
}

#[derive(Deserialize)]
struct StripeEvent {
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    created: i64,
    account: Option<String>,
    /// The API version the event is rendered in (`2025-03-31.basil`): the best guess of
    /// how a capture in part was reported where its charge's amounts cannot tell
    /// (`version_releases_as_refund`).
    api_version: Option<String>,
    data: StripeData,
}

#[derive(Deserialize)]
struct StripeData {
    object: Map<String, Value>,
}

/// Parses a Stripe event (`{id, type, created, account?, data: {object}}`).
pub fn parse_stripe(
    provider: &Provider,
    body: &[u8],
    max_quantity: u32,
) -> Result<ParsedEvent, EventError> {
    let event: StripeEvent =
        serde_json::from_slice(body).map_err(|e| EventError(format!("not a Stripe event: {e}")))?;
    // `created` is checked before anything else: an event whose version cannot be
    // folded is malformed whatever its type.
    let Some(created) = EventTime::new(event.created) else {
        return Err(EventError(format!(
            "not a Stripe event: created {} is not a unix time in seconds",
            event.created
        )));
    };
    Ok(
        match payment_event(provider, &event, created, max_quantity) {
            Ok(payment) => ParsedEvent::Payment(Box::new(payment)),
            Err(reason) => ParsedEvent::Ignored {
                event_id: event.id,
                event_type: event.event_type,
                reason: reason.to_owned(),
            },
        },
    )
}

/// The payment event `event` reports, or why it is ignored.
fn payment_event(
    provider: &Provider,
    event: &StripeEvent,
    created: EventTime,
    max_quantity: u32,
) -> Result<PaymentEvent, &'static str> {
    let kind = event.event_type.as_str();
    let object = &event.data.object;
    let session = kind.starts_with("checkout.session.");
    let (status, payment_id) = status_and_payment(kind, object)?;
    let account = event.account.as_deref().unwrap_or("default");
    let key = payment_key(provider, account, payment_id).ok_or("invalid account or payment id")?;
    // A session's amount is its `amount_total`, what the PaymentIntent is for.
    let mut amount = number(object, if session { "amount_total" } else { "amount" });
    let reversal = reversal(kind, object, created, &mut amount)?;
    let releases_as_refund = version_releases_as_refund(event);
    let (refund, rank) = refund(
        kind,
        object,
        status,
        created,
        releases_as_refund,
        &mut amount,
    )?;
    Ok(PaymentEvent {
        event_id: event.id.clone(),
        event_type: event.event_type.clone(),
        key,
        status,
        version: created.version(rank),
        amount,
        currency: text(object, "currency").map(str::to_owned),
        token_params: token_params(object, session, max_quantity),
        payment_date: number(object, "created")
            .or(Some(created.secs()))
            .and_then(|secs| DateTime::from_timestamp(secs, 0)),
        refund,
        reversal,
        capture: None,
        uncaptured: uncaptured(event, payment_id),
        authorises_capture: false,
        sole_metadata: false,
        customer_metadata: false,
        bought: None,
    })
}

/// The first API version whose partial captures and cancellations create no Refund.
const RELEASE_WITHOUT_REFUND: &str = "2025-03-31";

/// Whether `event` is rendered in an API version whose partial captures made the release
/// a Refund of the charge (before 2025-03-31, or a version it does not name). It says
/// how the merchant's webhook endpoint reads, not how the capture was made: that follows
/// the version of the capture's own request (an SDK pins its own), so the two may
/// differ, and this is only the last word where the amounts cannot tell (`refund`).
fn version_releases_as_refund(event: &StripeEvent) -> bool {
    event
        .api_version
        .as_deref()
        .and_then(|version| version.get(..RELEASE_WITHOUT_REFUND.len()))
        .is_none_or(|version| version < RELEASE_WITHOUT_REFUND)
}

/// What a PaymentIntent's success left uncaptured (`amount_received` below `amount`): it
/// succeeds once its last capture is made (a single one, or the final one of several),
/// and the rest is released to the cardholder, whatever the event's API version: a
/// capture made since 2025-03-31 reports no Refund for it, and one made before also
/// counted it among its charge's refunds, which `refund` sees and marks as the same money
/// (`Refund::release`), so that it counts once.
fn uncaptured(event: &StripeEvent, payment_id: Option<&str>) -> Option<Refund> {
    let object = &event.data.object;
    if event.event_type != "payment_intent.succeeded" {
        return None;
    }
    let released = number(object, "amount")? - number(object, "amount_received")?;
    let payment_id = payment_id?;
    (released > 0).then(|| Refund {
        id: format!("{UNCAPTURED_KIND}{payment_id}"),
        amount: Some(released),
        full: Some(false),
        reported_at: None,
        release: None,
    })
}

/// The status an event of type `kind` reports, and the PaymentIntent it is about; `Err`:
/// why it reports none.
fn status_and_payment<'a>(
    kind: &str,
    object: &'a Map<String, Value>,
) -> Result<(PaymentStatus, Option<&'a str>), &'static str> {
    let id = |field: &str| text(object, field);
    Ok(match kind {
        "payment_intent.processing" => (PaymentStatus::Processing, id("id")),
        "payment_intent.succeeded" => (PaymentStatus::Succeeded, id("id")),
        "payment_intent.payment_failed" => (PaymentStatus::Failed, id("id")),
        "payment_intent.canceled" => (PaymentStatus::Canceled, id("id")),
        "charge.refunded" | "charge.dispute.funds_withdrawn" => {
            (PaymentStatus::Refunded, id("payment_intent"))
        }
        // A dispute opened with its funds already taken (its `balance_transactions` name
        // the withdrawal) is the same withdrawal `funds_withdrawn` reports, under the
        // same id: whichever arrives, it counts once. One that took nothing yet is not.
        "charge.dispute.created" if withdrew_funds(object) => {
            (PaymentStatus::Refunded, id("payment_intent"))
        }
        "charge.dispute.created" => return Err("a dispute whose funds were not withdrawn"),
        // A dispute lost after a partial refund gives back what the cardholder had been
        // refunded already (Stripe's "partially won"): money the customer keeps through
        // the refund, so it stands for no token. Only a dispute won gives back its amount.
        "charge.dispute.funds_reinstated" if text(object, "status") != Some("won") => {
            return Err("funds reinstated by a dispute not won");
        }
        // Money coming back moves no state: the reversal is recorded and the money
        // decides (the status is the one a standing payment has).
        "charge.dispute.funds_reinstated"
        | "refund.failed"
        | "refund.updated"
        | "charge.refund.updated" => (PaymentStatus::Succeeded, id("payment_intent")),
        _ if kind.starts_with("checkout.session.") => {
            let status = session_status(kind, object)?;
            let intent =
                session_payment_intent(object).ok_or("a session without a payment_intent")?;
            (status, Some(intent))
        }
        _ => return Err("unhandled event type"),
    })
}

/// The token parameters: a session's own metadata first, else its PaymentIntent's when
/// the event carries it expanded; without either, the PaymentIntent's events bring them.
fn token_params(
    object: &Map<String, Value>,
    session: bool,
    max_quantity: u32,
) -> Option<Result<IssuanceParams, String>> {
    let metadata = |object: &Map<String, Value>| {
        object
            .get("metadata")
            .and_then(Value::as_object)
            .and_then(|metadata| tokenmint_params(metadata, "", max_quantity))
    };
    metadata(object).or_else(|| {
        object
            .get("payment_intent")
            .and_then(Value::as_object)
            .filter(|_| session)
            .and_then(metadata)
    })
}

/// The money an event of type `kind` gives back, if any. What it gives back is taken out
/// of `amount`, which is then not the payment's.
fn reversal(
    kind: &str,
    object: &Map<String, Value>,
    created: EventTime,
    amount: &mut Option<i64>,
) -> Result<Option<Reversal>, &'static str> {
    let object_id = text(object, "id").unwrap_or_default();
    Ok(match kind {
        // A dispute won gives back what its withdrawal took (the Dispute's `amount`;
        // `status_and_payment` ignores one not won).
        "charge.dispute.funds_reinstated" => {
            let reinstated = amount.take().ok_or("dispute without amount")?;
            let dispute = format!("dispute:{object_id}");
            Some(Reversal {
                id: dispute.clone(),
                amount: reinstated,
                of: Some(dispute),
                at: Some(created.secs()),
                since: None,
            })
        }
        // A refund that failed or was canceled gives its amount back. It was counted in
        // its charge's running total (`charge.refunded`), so it reverses that total;
        // a later report of the charge leaves it out already (`Store::record_refund`).
        "refund.failed" | "refund.updated" | "charge.refund.updated" => {
            if !matches!(text(object, "status"), Some("failed" | "canceled")) {
                return Err("a refund neither failed nor canceled");
            }
            let (Some(given_back), Some(charge)) = (amount.take(), text(object, "charge")) else {
                return Err("refund without amount or charge");
            };
            Some(Reversal {
                id: format!("refund:{object_id}"),
                amount: given_back,
                of: Some(format!("charge:{charge}")),
                at: Some(created.secs()),
                // A report of the charge from before the refund was made never counted
                // it: its failure gives back nothing until one from since then is in.
                since: number(object, "created"),
            })
        }
        _ => None,
    })
}

/// The refund an event of type `kind` reports, if any, and the rank its version folds.
/// A dispute's amount is taken out of `amount`: it is what was taken back, not the
/// payment's amount. `releases_as_refund`: the event's API version counted a capture's
/// release among the charge's refunds (`version_releases_as_refund`).
fn refund(
    kind: &str,
    object: &Map<String, Value>,
    status: PaymentStatus,
    created: EventTime,
    releases_as_refund: bool,
    amount: &mut Option<i64>,
) -> Result<(Option<Refund>, i64), &'static str> {
    let object_id = text(object, "id").unwrap_or_default();
    Ok(match kind {
        // A charge fully refunded says `refunded: true`; otherwise `amount_refunded` of its
        // `amount` is its refunds so far (a running total, so it is kept per charge). A
        // full refund ranks above a partial one, which ranks as the success it may leave
        // standing, so a full refund in the same second as a partial one still wins.
        "charge.refunded" => {
            // A charge captured in part and then refunded whole says `refunded: true` of
            // what it captured only: its `amount_refunded` is that, and with the release
            // (`uncaptured`; for a capture made before 2025-03-31, also in the charge's
            // own refunds) it adds up to the payment's amount, as refunds of part of it do.
            let captured = number(object, "amount_captured");
            let released = match (captured, *amount) {
                (Some(captured), Some(amount)) if captured < amount => Some(amount - captured),
                _ => None,
            };
            let refunded_whole = object.get("refunded").and_then(Value::as_bool) == Some(true);
            let full = refunded_whole && released.is_none();
            let refunded = match (full, number(object, "amount_refunded")) {
                (true, refunded) => refunded.max(*amount),
                (false, Some(refunded)) => Some(refunded),
                (false, None) => return Err("partial refund without amount_refunded"),
            };
            // Whether the total holds the release: a capture made before 2025-03-31
            // counted it (so its total is at least the release), one made since cannot
            // refund more than was captured. Where both could be, the event's version
            // says, the best guess there is (`version_releases_as_refund`); the payment
            // keeps the proofs and the first report's guess (`RecordedRelease`).
            let release = released
                .zip(captured)
                .map(|(released, captured)| ReleaseReport {
                    captured,
                    released,
                    proven: refunded.and_then(|refunded| {
                        if refunded > captured {
                            Some(true)
                        } else if refunded < released
                            || (refunded_whole && Some(refunded) < *amount)
                        {
                            // Refunded whole for less than the amount: the total would
                            // be the whole amount if it held the release.
                            Some(false)
                        } else {
                            None
                        }
                    }),
                    guessed: releases_as_refund,
                });
            let refund = Refund {
                id: format!("charge:{object_id}"),
                amount: refunded,
                full: full.then_some(true),
                reported_at: Some(created.secs()),
                release,
            };
            let rank = if full {
                status.rank()
            } else {
                PaymentStatus::Succeeded.rank()
            };
            (Some(refund), rank)
        }
        // The Dispute's `amount` is what the cardholder's bank took back: a refund of that
        // much, kept under the dispute's own id so it adds to the charge's refunds.
        "charge.dispute.funds_withdrawn" | "charge.dispute.created" => {
            let disputed = amount.take().ok_or("dispute without amount")?;
            let refund = Refund {
                id: format!("dispute:{object_id}"),
                amount: Some(disputed),
                full: None,
                reported_at: None,
                release: None,
            };
            (Some(refund), status.rank())
        }
        _ => (None, status.rank()),
    })
}

fn number(object: &Map<String, Value>, field: &str) -> Option<i64> {
    object.get(field).and_then(Value::as_i64)
}

/// What a Checkout Session event says of its payment, or why it says nothing: only
/// sessions of `mode: "payment"` are payments (subscriptions and setups are not), and
/// `completed` is a success only once `payment_status` is `paid` (an asynchronous method
/// completes `unpaid`, then reports `async_payment_succeeded` or `_failed`). An expired
/// session's PaymentIntent is canceled with it.
fn session_status(
    event_type: &str,
    session: &Map<String, Value>,
) -> Result<PaymentStatus, &'static str> {
    if session.get("mode").and_then(Value::as_str) != Some("payment") {
        return Err("not a session of mode payment");
    }
    let payment_status = session.get("payment_status").and_then(Value::as_str);
    match (event_type, payment_status) {
        ("checkout.session.completed", Some("paid")) => Ok(PaymentStatus::Succeeded),
        ("checkout.session.completed", Some("unpaid")) => Ok(PaymentStatus::Processing),
        ("checkout.session.completed", _) => Err("a completed session without a payment"),
        ("checkout.session.async_payment_succeeded", _) => Ok(PaymentStatus::Succeeded),
        ("checkout.session.async_payment_failed", _) => Ok(PaymentStatus::Failed),
        ("checkout.session.expired", _) => Ok(PaymentStatus::Canceled),
        _ => Err("unhandled event type"),
    }
}

/// Whether a Dispute's funds were withdrawn: its `balance_transactions` list one.
fn withdrew_funds(dispute: &Map<String, Value>) -> bool {
    dispute
        .get("balance_transactions")
        .and_then(Value::as_array)
        .is_some_and(|transactions| !transactions.is_empty())
}

/// The PaymentIntent a session names: its id, or the id of the object when expanded.
fn session_payment_intent(session: &Map<String, Value>) -> Option<&str> {
    let intent = session.get("payment_intent")?;
    intent
        .as_str()
        .or_else(|| intent.get("id").and_then(Value::as_str))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::webhooks::events::RANK_FACTOR;
    use crate::webhooks::signing::{SignatureError, verify_with};

    const NOW: i64 = 1_780_000_000;

    fn check_header(
        header: Option<&str>,
        body: &[u8],
        keys: &[&str],
    ) -> Result<(), SignatureError> {
        verify_with(keys, 300, NOW, |check| SCHEME.verify(header, body, check))
    }

    fn check(header: &str, body: &[u8], keys: &[&str]) -> Result<(), SignatureError> {
        check_header(Some(header), body, keys)
    }

    #[test]
    fn stripe_accepts_any_matching_v1_and_rotated_secrets() {
        let body = br#"{"id":"evt_1"}"#;
        let good = sign_stripe("whsec_new", NOW, body);
        assert_eq!(check(&good, body, &["whsec_new"]), Ok(()));
        assert_eq!(check(&good, body, &["whsec_old", "whsec_new"]), Ok(()));
        let v1 = good.split(",v1=").nth(1).unwrap();
        let several = format!("t={NOW},v1={},v1={v1}", "00".repeat(32));
        assert_eq!(check(&several, body, &["whsec_new"]), Ok(()));
    }

    #[test]
    fn stripe_refusals() {
        let body = br#"{"id":"evt_1"}"#;
        let good = sign_stripe("whsec_a", NOW, body);
        assert_eq!(
            check(&good, b"{}", &["whsec_a"]),
            Err(SignatureError::Invalid),
            "body changed"
        );
        assert_eq!(
            check(&good, body, &["whsec_b"]),
            Err(SignatureError::Invalid),
            "other secret"
        );
        let v0_only = good.replace("v1=", "v0=");
        assert_eq!(
            check(&v0_only, body, &["whsec_a"]),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check("garbage", body, &["whsec_a"]),
            Err(SignatureError::Invalid)
        );
        let old = sign_stripe("whsec_a", NOW - 301, body);
        assert_eq!(
            check(&old, body, &["whsec_a"]),
            Err(SignatureError::OutOfTolerance)
        );
        let future = sign_stripe("whsec_a", NOW + 301, body);
        assert_eq!(
            check(&future, body, &["whsec_a"]),
            Err(SignatureError::OutOfTolerance)
        );
        assert_eq!(
            check_header(None, body, &["whsec_a"]),
            Err(SignatureError::Missing)
        );
    }

    fn stripe() -> Provider {
        Provider::parse("stripe").unwrap()
    }

    #[test]
    fn a_success_captured_in_part_reports_the_rest_released() {
        let parse = |version: Option<&str>, kind: &str, received: Option<i64>| {
            let mut body = json!({"id": "evt_1", "type": kind, "created": 1_780_000_000,
                "data": {"object": {"id": "pi_1", "amount": 1000, "currency": "eur"}}});
            if let Some(version) = version {
                body["api_version"] = version.into();
            }
            if let Some(received) = received {
                body["data"]["object"]["amount_received"] = received.into();
            }
            let ParsedEvent::Payment(event) =
                parse_stripe(&stripe(), body.to_string().as_bytes(), 1000).unwrap()
            else {
                panic!("{kind}")
            };
            event.uncaptured
        };
        let basil = Some("2025-03-31.basil");
        let success = "payment_intent.succeeded";
        let released = parse(basil, success, Some(400)).expect("600 released");
        assert_eq!(released.id, "uncaptured:pi_1");
        assert_eq!((released.amount, released.full), (Some(600), Some(false)));
        assert!(parse(Some("2026-01-28.clover"), success, Some(400)).is_some());
        // Captured whole or more (overcapture), or not said: nothing released.
        assert_eq!(parse(basil, success, Some(1000)), None);
        assert_eq!(parse(basil, success, Some(1200)), None);
        assert_eq!(parse(basil, success, None), None);
        // Only a success says it, in every version: the capture follows its own
        // request's version, which no event names (the charge's refunds say the rest).
        assert_eq!(parse(basil, "payment_intent.processing", Some(0)), None);
        assert_eq!(parse(basil, "payment_intent.canceled", Some(0)), None);
        assert_eq!(
            parse(Some("2025-02-24.acacia"), success, Some(400)),
            Some(released.clone())
        );
        assert_eq!(parse(None, success, Some(400)), Some(released.clone()));
    }

    #[test]
    fn a_charge_captured_in_part_says_when_its_refunds_hold_the_release() {
        // A charge of 1000 of which 400 were captured: 600 released.
        let release = |version: &str, captured: i64, refunded: i64| {
            let body = json!({"id": "evt_r", "type": "charge.refunded", "created": 1,
                "api_version": version,
                "data": {"object": {"id": "ch_1", "payment_intent": "pi_1", "amount": 1000,
                "amount_captured": captured, "amount_refunded": refunded, "refunded": false}}});
            let ParsedEvent::Payment(event) =
                parse_stripe(&stripe(), body.to_string().as_bytes(), 10).unwrap()
            else {
                panic!("a refund is a payment event")
            };
            let refund = event.refund.expect("a refund");
            assert_eq!(refund.amount, Some(refunded), "the total as reported");
            refund.release
        };
        let (old, basil) = ("2024-06-20", "2025-03-31.basil");
        let report = |released, proven, guessed| {
            Some(ReleaseReport {
                captured: 1000 - released,
                released,
                proven,
                guessed,
            })
        };
        for (version, guessed) in [(old, true), (basil, false)] {
            // More than was captured: only a capture that counted its release refunds so.
            assert_eq!(
                release(version, 400, 700),
                report(600, Some(true), guessed),
                "{version}"
            );
            // Less than the release: a capture since 2025-03-31, which counted none.
            assert_eq!(
                release(version, 400, 100),
                report(600, Some(false), guessed),
                "{version}"
            );
            // Captured whole: there is no release.
            assert_eq!(release(version, 1000, 300), None, "{version}");
        }
        // Either could be (700 captured, 300 released, 300 refunded): the version guesses.
        assert_eq!(release(old, 700, 300), report(300, None, true));
        assert_eq!(release(basil, 700, 300), report(300, None, false));
    }

    #[test]
    fn stripe_succeeded_with_metadata() {
        let body = json!({"id": "evt_1", "type": "payment_intent.succeeded", "created": 1_780_000_000,
            "data": {"object": {"id": "pi_1", "amount": 500, "currency": "eur", "status": "succeeded",
            "metadata": {"tokenmint_owner": "65f1a0c2b3d4e5f601234567", "tokenmint_token_type": "standard", "tokenmint_quantity": "4"}}}});
        let ParsedEvent::Payment(event) =
            parse_stripe(&stripe(), body.to_string().as_bytes(), 1000).unwrap()
        else {
            panic!()
        };
        assert_eq!(event.key.account_id.as_str(), "default");
        assert_eq!(event.status, PaymentStatus::Succeeded);
        assert_eq!(event.token_params.unwrap().unwrap().quantity.get(), 4);
        assert!(event.version > PaymentStatus::Processing.rank() * RANK_FACTOR + 1_800_000_000);
    }

    #[test]
    fn stripe_bad_metadata_is_reported_not_fatal() {
        let body = json!({"id": "evt_1", "type": "payment_intent.succeeded", "created": 1, "account": "acct_9",
            "data": {"object": {"id": "pi_1", "metadata": {"tokenmint_owner": "x", "tokenmint_quantity": "4.5"}}}});
        let ParsedEvent::Payment(event) =
            parse_stripe(&stripe(), body.to_string().as_bytes(), 1000).unwrap()
        else {
            panic!()
        };
        let reason = event.token_params.unwrap().unwrap_err();
        assert!(
            reason.contains("tokenmint_owner")
                && reason.contains("tokenmint_token_type")
                && reason.contains("tokenmint_quantity"),
            "{reason}"
        );
        assert_eq!(event.key.account_id.as_str(), "acct_9");
    }

    #[test]
    fn stripe_refunds_full_and_partial_and_unknown_types() {
        let partial = json!({"id": "evt_2", "type": "charge.refunded", "created": 1,
            "data": {"object": {"id": "ch_1", "payment_intent": "pi_1", "amount": 40, "refunded": false, "amount_refunded": 10}}});
        let ParsedEvent::Payment(event) =
            parse_stripe(&stripe(), partial.to_string().as_bytes(), 10).unwrap()
        else {
            panic!("a partial refund is a payment event")
        };
        assert_eq!(
            (event.status, event.amount, event.refund.unwrap().amount),
            (PaymentStatus::Refunded, Some(40), Some(10))
        );
        let partial_version = event.version;
        let full = json!({"id": "evt_4", "type": "charge.refunded", "created": 1,
            "data": {"object": {"id": "ch_1", "payment_intent": "pi_1", "amount": 40, "refunded": true, "amount_refunded": 40}}});
        let ParsedEvent::Payment(event) =
            parse_stripe(&stripe(), full.to_string().as_bytes(), 10).unwrap()
        else {
            panic!("a full refund is a payment event")
        };
        assert_eq!(
            event.refund,
            Some(Refund {
                id: "charge:ch_1".to_owned(),
                amount: Some(40),
                full: Some(true),
                reported_at: Some(1),
                release: None,
            }),
            "a full refund refunds it all"
        );
        assert!(
            event.version > partial_version,
            "a full refund outranks a partial one of the same second"
        );
        let other = json!({"id": "evt_3", "type": "customer.created", "created": 1, "data": {"object": {}}});
        assert!(matches!(
            parse_stripe(&stripe(), other.to_string().as_bytes(), 10).unwrap(),
            ParsedEvent::Ignored { .. }
        ));
        assert!(parse_stripe(&stripe(), b"[]", 10).is_err());
    }

    #[test]
    fn stripe_created_out_of_range_is_malformed() {
        // Found by scripts/fuzz-api.sh: `created: i64::MAX` overflowed the version.
        for created in [i64::MAX, i64::MIN, -1, RANK_FACTOR] {
            let body = json!({"id": "evt_1", "type": "payment_intent.succeeded", "created": created,
                "data": {"object": {"id": "pi_1"}}});
            assert!(
                parse_stripe(&stripe(), body.to_string().as_bytes(), 10).is_err(),
                "{created}"
            );
        }
    }

    #[test]
    fn checkout_sessions_report_their_payment_intent() {
        let session = |event_type: &str, mode: &str, payment_status: &str, intent: Value| {
            let body = json!({"id": "evt_cs", "type": event_type, "created": 5,
                "data": {"object": {"id": "cs_1", "object": "checkout.session", "mode": mode,
                "payment_intent": intent, "payment_status": payment_status,
                "amount_total": 800, "currency": "eur", "metadata": {}}}});
            parse_stripe(&stripe(), body.to_string().as_bytes(), 10).unwrap()
        };
        let status = |event: ParsedEvent| match event {
            ParsedEvent::Payment(event) => {
                assert_eq!(event.key.payment_intent_id.as_str(), "pi_1");
                assert_eq!(event.amount, Some(800), "amount_total");
                Some(event.status)
            }
            ParsedEvent::Ignored { .. } => None,
        };
        use PaymentStatus::*;
        let pi = json!("pi_1");
        let cases = [
            (
                "checkout.session.completed",
                "payment",
                "paid",
                Some(Succeeded),
            ),
            (
                "checkout.session.completed",
                "payment",
                "unpaid",
                Some(Processing),
            ),
            (
                "checkout.session.completed",
                "payment",
                "no_payment_required",
                None,
            ),
            (
                "checkout.session.async_payment_succeeded",
                "payment",
                "paid",
                Some(Succeeded),
            ),
            (
                "checkout.session.async_payment_failed",
                "payment",
                "unpaid",
                Some(Failed),
            ),
            (
                "checkout.session.expired",
                "payment",
                "unpaid",
                Some(Canceled),
            ),
            ("checkout.session.completed", "subscription", "paid", None),
            (
                "checkout.session.completed",
                "setup",
                "no_payment_required",
                None,
            ),
        ];
        for (event_type, mode, paid, expected) in cases {
            assert_eq!(
                status(session(event_type, mode, paid, pi.clone())),
                expected,
                "{event_type} {mode} {paid}"
            );
        }
        let expanded = json!({"id": "pi_1", "metadata": {"tokenmint_owner": "65f1a0c2b3d4e5f601234567",
            "tokenmint_token_type": "standard", "tokenmint_quantity": "3"}});
        let ParsedEvent::Payment(event) =
            session("checkout.session.completed", "payment", "paid", expanded)
        else {
            panic!("an expanded PaymentIntent names the payment")
        };
        assert_eq!(event.token_params.unwrap().unwrap().quantity.get(), 3);
        assert!(matches!(
            session("checkout.session.expired", "payment", "unpaid", Value::Null),
            ParsedEvent::Ignored { .. }
        ));
    }

    #[test]
    fn reinstated_disputes_and_failed_refunds_are_reversals_of_their_withdrawal() {
        let parse =
            |body: Value| match parse_stripe(&stripe(), body.to_string().as_bytes(), 10).unwrap() {
                ParsedEvent::Payment(event) => Some(event),
                ParsedEvent::Ignored { .. } => None,
            };
        let reinstated = |status: Value| {
            parse(
                json!({"id": "evt_6", "type": "charge.dispute.funds_reinstated", "created": 3,
                "data": {"object": {"id": "du_1", "charge": "ch_1", "payment_intent": "pi_1",
                "amount": 300, "status": status}}}),
            )
        };
        // Lost (after a partial refund): what comes back was refunded already.
        for not_won in [json!("lost"), Value::Null] {
            assert!(reinstated(not_won).is_none());
        }
        let won = reinstated(json!("won")).unwrap();
        assert_eq!(
            won.amount, None,
            "the dispute's amount is not the payment's"
        );
        assert_eq!(won.refund, None);
        assert_eq!(
            won.reversal,
            Some(Reversal {
                id: "dispute:du_1".to_owned(),
                amount: 300,
                of: Some("dispute:du_1".to_owned()),
                at: Some(3),
                since: None,
            })
        );
        for (event_type, status, reverses) in [
            ("refund.failed", "failed", true),
            ("refund.updated", "canceled", true),
            ("charge.refund.updated", "failed", true),
            ("refund.updated", "succeeded", false),
            ("charge.refund.updated", "pending", false),
        ] {
            let failed = parse(json!({"id": "evt_7", "type": event_type, "created": 4,
                "data": {"object": {"id": "re_1", "charge": "ch_1", "payment_intent": "pi_1",
                "amount": 100, "status": status, "created": 2}}}));
            assert_eq!(
                failed.and_then(|e| e.reversal),
                reverses.then(|| Reversal {
                    id: "refund:re_1".to_owned(),
                    amount: 100,
                    of: Some("charge:ch_1".to_owned()),
                    at: Some(4),
                    since: Some(2),
                }),
                "{event_type} {status}"
            );
        }
    }

    #[test]
    fn a_dispute_created_counts_as_its_withdrawal_only_once_funds_are_taken() {
        let created = |transactions: Value| {
            let body = json!({"id": "evt_c", "type": "charge.dispute.created", "created": 2,
                "data": {"object": {"id": "du_1", "charge": "ch_1", "payment_intent": "pi_1",
                "amount": 300, "balance_transactions": transactions}}});
            match parse_stripe(&stripe(), body.to_string().as_bytes(), 10).unwrap() {
                ParsedEvent::Payment(event) => event.refund,
                ParsedEvent::Ignored { .. } => None,
            }
        };
        assert_eq!(created(json!([])), None, "nothing withdrawn yet");
        assert_eq!(
            created(json!([{"id": "txn_1", "amount": -300}])),
            Some(Refund {
                id: "dispute:du_1".to_owned(),
                amount: Some(300),
                full: None,
                reported_at: None,
                release: None,
            }),
            "the same withdrawal funds_withdrawn reports"
        );
    }

    #[test]
    fn a_withdrawn_dispute_is_a_refund_of_its_amount_under_its_own_id() {
        let body = json!({"id": "evt_5", "type": "charge.dispute.funds_withdrawn", "created": 2,
            "data": {"object": {"id": "du_1", "charge": "ch_1", "payment_intent": "pi_1", "amount": 300}}});
        let ParsedEvent::Payment(event) =
            parse_stripe(&stripe(), body.to_string().as_bytes(), 10).unwrap()
        else {
            panic!("a dispute is a payment event")
        };
        assert_eq!(event.key.payment_intent_id.as_str(), "pi_1");
        assert_eq!(
            event.amount, None,
            "the disputed amount is not the payment's"
        );
        assert_eq!(
            event.refund,
            Some(Refund {
                id: "dispute:du_1".to_owned(),
                amount: Some(300),
                full: None,
                reported_at: None,
                release: None,
            })
        );
    }
}
