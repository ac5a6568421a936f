//! Stripe and Standard Webhooks events: any body is refused or parsed without a panic,
//! and what parses has inert keys, the version its scheme promises and a quantity in range.

use proptest::prelude::*;
use serde_json::{Value, json};

use tokenmint::domain::{ParsedEvent, PaymentStatus, Provider};
use tokenmint::webhooks::{parse_standard, parse_stripe};

use crate::{bytes, check_payment_event, field, identifier, json_value, tokenmint_metadata};

/// Stripe-shaped events whose every field is drawn from valid, borderline and wrong values.
fn stripe_event() -> impl Strategy<Value = Value> {
    let event_type = prop_oneof![
        Just("payment_intent.processing"),
        Just("payment_intent.succeeded"),
        Just("payment_intent.payment_failed"),
        Just("payment_intent.canceled"),
        Just("charge.refunded"),
        Just("charge.dispute.funds_reinstated"),
        Just("refund.failed"),
        Just("customer.created"),
    ];
    let object = (
        field(identifier(130)),
        field(any::<bool>().prop_map(Value::from)),
        field(tokenmint_metadata("")),
        field(any::<i64>().prop_map(Value::from)),
        // A dispute's outcome (only one won gives its funds back as tokens), or a
        // refund's (only one failed or canceled gives its amount back).
        field(
            prop_oneof![
                Just("won"),
                Just("lost"),
                Just("failed"),
                Just("canceled"),
                Just("succeeded")
            ]
            .prop_map(Value::from),
        ),
    )
        .prop_map(|(id, refunded, metadata, created, status)| {
            json!({"id": id, "payment_intent": id, "refunded": refunded, "metadata": metadata,
                   "created": created, "amount": created, "currency": "eur", "status": status})
        });
    // Unix seconds, mostly plausible, with the edges a version computation can trip on.
    let created = prop_oneof![
        4 => 0i64..10_000_000_000,
        1 => prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(-1i64),
            Just(10_000_000_000i64),
            any::<i64>()
        ],
    ];
    (
        ".{0,20}",
        event_type,
        created,
        prop::option::of(field(identifier(70))),
        object,
    )
        .prop_map(|(id, event_type, created, account, object)| {
            let mut event = json!({"id": id, "type": event_type, "created": created,
                                   "data": {"object": object}});
            if let Some(account) = account {
                event["account"] = account;
            }
            event
        })
}

/// Standard-Webhooks-shaped events, likewise.
fn standard_event() -> impl Strategy<Value = Value> {
    let event_type = prop_oneof![
        Just("payment.processing"),
        Just("payment.succeeded"),
        Just("payment.failed"),
        Just("payment.canceled"),
        Just("payment.refunded"),
        Just("payment.unknown"),
    ];
    let data = (
        field(identifier(70)),
        field(identifier(130)),
        field(any::<i64>().prop_map(Value::from)),
        field(Just(json!("65f1a0c2b3d4e5f601234567"))),
        field(Just(json!("gold"))),
        field(any::<i64>().prop_map(Value::from)),
        field(".{0,30}".prop_map(Value::from)),
    )
        .prop_map(
            |(account, payment, version, owner, token_type, quantity, date)| {
                json!({"accountId": account, "paymentIntentId": payment, "version": version,
                   "owner": owner, "tokenType": token_type, "quantity": quantity,
                   "paymentDate": date, "amount": version})
            },
        );
    (event_type, field(data))
        .prop_map(|(event_type, data)| json!({"type": event_type, "timestamp": "x", "data": data}))
}

proptest! {
    #[test]
    fn event_parsers_never_panic_on_bytes(body in bytes(512), id in any::<String>(), max in any::<u32>()) {
        let provider = Provider::parse("stripe").unwrap();
        let _ = parse_stripe(&provider, &body, max);
        let _ = parse_standard(&provider, &id, &body, max);
    }

    #[test]
    fn event_parsers_never_panic_on_json(value in json_value(), max in any::<u32>()) {
        let provider = Provider::parse("acme").unwrap();
        let body = serde_json::to_vec(&value).unwrap();
        let _ = parse_stripe(&provider, &body, max);
        let _ = parse_standard(&provider, "msg_1", &body, max);
    }

    #[test]
    fn stripe_events_parse_to_valid_keys_and_ordered_versions(
        event in stripe_event(),
        max in 1u32..=1000,
    ) {
        let provider = Provider::parse("stripe").unwrap();
        let body = serde_json::to_vec(&event).unwrap();
        if let Ok(ParsedEvent::Payment(parsed)) = parse_stripe(&provider, &body, max) {
            check_payment_event(&parsed, max)?;
            // The version orders by status rank first: `created` never outranks a status.
            let created = event["created"].as_i64().unwrap();
            prop_assert!((0..10_000_000_000).contains(&created));
            prop_assert_eq!(parsed.version, parsed.status.rank() * 10_000_000_000 + created);
        }
    }

    #[test]
    fn standard_events_parse_to_valid_keys(event in standard_event(), max in 1u32..=1000) {
        let provider = Provider::parse("acme").unwrap();
        let body = serde_json::to_vec(&event).unwrap();
        if let Ok(ParsedEvent::Payment(parsed)) = parse_standard(&provider, "msg_1", &body, max) {
            check_payment_event(&parsed, max)?;
            prop_assert_eq!(Some(parsed.version), event["data"]["version"].as_i64());
        }
    }
}

#[test]
fn payment_status_ranks_stay_below_the_stripe_factor() {
    // The Stripe version is rank * 10^10 + created; ranks must stay small enough that
    // the largest version fits an i64.
    for status in [
        PaymentStatus::Processing,
        PaymentStatus::Failed,
        PaymentStatus::Succeeded,
        PaymentStatus::Canceled,
        PaymentStatus::Refunded,
    ] {
        assert!(
            status
                .rank()
                .checked_mul(10_000_000_000)
                .and_then(|v| v.checked_add(9_999_999_999))
                .is_some()
        );
    }
}
