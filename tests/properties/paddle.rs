//! Paddle: a body signed with `sign_paddle` verifies under its secret, among rotated ones,
//! within the tolerance; any change to the body, the timestamp or a signature digit is
//! refused; and no header or body, however malformed, panics the verifier or the parser.

use proptest::prelude::*;
use serde_json::{Value, json};

use tokenmint::domain::{ParsedEvent, Provider, TokenPacks};
use tokenmint::settings::WebhookScheme;
use tokenmint::webhooks::paddle::{parse_paddle, sign_paddle};
use tokenmint::webhooks::signature::{SignatureError, SignatureHeaders};

use crate::secrets::paddle_secret;
use crate::{
    TOLERANCE, bytes, check_payment_event, field, identifier, json_value, out_of_tolerance,
    signed_at, tokenmint_metadata, verify,
};

/// Verifies a Paddle delivery with `Paddle-Signature: header` under `keys` at `now`.
fn paddle(header: &str, body: &[u8], keys: &[&str], now: i64) -> Result<(), SignatureError> {
    let headers = SignatureHeaders {
        paddle_signature: Some(header),
        ..Default::default()
    };
    verify(WebhookScheme::Paddle, &headers, body, keys, TOLERANCE, now)
}

/// Paddle-shaped events: the handled types and one that is not, refunds, chargebacks and
/// other adjustments in any status, amounts as strings or numbers, times that are or are not RFC 3339.
fn paddle_event() -> impl Strategy<Value = Value> {
    let event_type = prop_oneof![
        Just("transaction.completed"),
        Just("transaction.payment_failed"),
        Just("transaction.canceled"),
        Just("adjustment.created"),
        Just("adjustment.updated"),
        Just("subscription.created"),
    ];
    let occurred_at = prop_oneof![
        4 => "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][1-9]T[01][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]0[0-9]:[0-5][0-9])",
        1 => prop_oneof![Just("1969-12-31T23:59:59Z".to_owned()), ".{0,30}"],
    ];
    let minor_units = || {
        field(prop_oneof![
            "-?[0-9]{1,22}".prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
        ])
    };
    let data = (
        field(identifier(130)),
        field(identifier(130)),
        field(prop_oneof![
            Just(json!("refund")),
            Just(json!("credit")),
            Just(json!("chargeback")),
            Just(json!("chargeback_warning")),
            Just(json!("chargeback_reverse")),
        ]),
        field(prop_oneof![
            Just(json!("approved")),
            Just(json!("pending_approval")),
            Just(json!("rejected")),
            Just(json!("reversed")),
        ]),
        field(prop_oneof![Just(json!("full")), Just(json!("partial"))]),
        minor_units(),
        minor_units(),
        field(tokenmint_metadata("")),
        field(items()),
    )
        .prop_map(
            |(id, transaction, action, status, kind, total, grand_total, custom, items)| {
                json!({"id": id, "transaction_id": transaction, "action": action,
                       "status": status, "type": kind, "totals": {"total": total},
                       "details": {"totals": {"grand_total": grand_total}},
                       "currency_code": "EUR", "custom_data": custom, "items": items})
            },
        );
    (".{0,20}", event_type, occurred_at, data).prop_map(|(id, event_type, occurred, data)| {
        json!({"event_id": id, "event_type": event_type, "occurred_at": occurred, "data": data})
    })
}

/// A transaction's `items`: prices that are packs (`packs`), one that is not, and
/// anything else, in any quantity.
fn items() -> impl Strategy<Value = Value> {
    let price = prop_oneof![
        Just(json!({"id": "pri_ten"})),
        Just(json!({"id": "pri_plan"})),
        json_value(),
    ];
    let quantity = prop_oneof![any::<i64>().prop_map(Value::from), json_value()];
    let item = (price, quantity)
        .prop_map(|(price, quantity)| json!({"price": price, "quantity": quantity}));
    prop::collection::vec(item, 0..4).prop_map(Value::from)
}

/// The packs the parser reads items through: `pri_ten` sells ten credits.
fn packs() -> TokenPacks {
    serde_json::from_value(json!({"pri_ten": {"token_type": "credit", "quantity": 10}})).unwrap()
}

proptest! {
    #[test]
    fn paddle_signature_verifies_only_its_own_body_secret_and_time(
        secret in paddle_secret(),
        other_secret in paddle_secret(),
        body in bytes(512),
        other_body in bytes(512),
        (timestamp, skew) in signed_at(),
        late in out_of_tolerance(),
    ) {
        let header = sign_paddle(&secret, timestamp, &body);
        let now = timestamp + skew;
        prop_assert_eq!(paddle(&header, &body, &[&secret], now), Ok(()));
        // Among rotated secrets, in any position.
        prop_assert_eq!(paddle(&header, &body, &[&other_secret, &secret], now), Ok(()));
        if other_body != body {
            prop_assert_eq!(
                paddle(&header, &other_body, &[&secret], now),
                Err(SignatureError::Invalid)
            );
        }
        if other_secret != secret {
            prop_assert_eq!(
                paddle(&header, &body, &[&other_secret], now),
                Err(SignatureError::Invalid)
            );
        }
        prop_assert_eq!(
            paddle(&header, &body, &[&secret], timestamp + late),
            Err(SignatureError::OutOfTolerance)
        );
    }

    #[test]
    fn paddle_any_change_to_body_or_signature_is_refused(
        secret in paddle_secret(),
        body in bytes(512),
        (timestamp, skew) in signed_at(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        digit in 0usize..64,
        shift in 1u8..16,
        moved in prop_oneof![-300i64..0, 1i64..=300],
    ) {
        let now = timestamp + skew;
        let header = sign_paddle(&secret, timestamp, &body);
        let h1 = header.split_once(";h1=").expect("ts=…;h1=…").1;
        // One byte of the body changed.
        if !body.is_empty() {
            let mut changed = body.clone();
            changed[at.index(body.len())] ^= flip;
            prop_assert_eq!(paddle(&header, &changed, &[&secret], now), Err(SignatureError::Invalid));
        }
        // One hex digit of the signature changed.
        let mut digits = h1.as_bytes().to_vec();
        let value = (char::from(digits[digit]).to_digit(16).unwrap() as u8 + shift) % 16;
        digits[digit] = char::from_digit(u32::from(value), 16).unwrap() as u8;
        let forged = format!("ts={timestamp};h1={}", String::from_utf8(digits).unwrap());
        prop_assert_eq!(paddle(&forged, &body, &[&secret], now), Err(SignatureError::Invalid));
        // The signature kept, the timestamp it covers moved (checked at that very time, so
        // only the signature can refuse it).
        let moved_at = timestamp + moved;
        let moved = format!("ts={moved_at};h1={h1}");
        prop_assert_eq!(paddle(&moved, &body, &[&secret], moved_at), Err(SignatureError::Invalid));
    }

    #[test]
    fn paddle_verify_never_panics(
        header in prop_oneof![
            any::<String>(),
            "(ts=-?[0-9]{0,20}|h1=[0-9a-f]{0,66}|h2=.{0,4}|[=; ]|.){0,8}",
        ],
        body in bytes(256),
        key in prop_oneof![any::<String>(), paddle_secret()],
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let headers = SignatureHeaders { paddle_signature: Some(&header), ..Default::default() };
        let _ = verify(WebhookScheme::Paddle, &headers, &body, &[&key], tolerance, now);
    }

    #[test]
    fn paddle_parser_never_panics_on_bytes_or_json(
        body in bytes(512),
        value in json_value(),
        max in any::<u32>(),
    ) {
        let provider = Provider::parse("paddle").unwrap();
        let _ = parse_paddle(&provider, &body, max, &packs());
        let _ = parse_paddle(&provider, &serde_json::to_vec(&value).unwrap(), max, &packs());
    }

    #[test]
    fn paddle_events_parse_to_valid_keys(event in paddle_event(), max in 1u32..=1000) {
        let provider = Provider::parse("paddle").unwrap();
        let body = serde_json::to_vec(&event).unwrap();
        if let Ok(ParsedEvent::Payment(parsed)) = parse_paddle(&provider, &body, max, &packs()) {
            check_payment_event(&parsed, max)?;
            prop_assert_eq!(parsed.key.account_id.as_str(), "default");
            // A transaction's items are read through the packs; an adjustment has none.
            let transaction = event["event_type"].as_str().unwrap().starts_with("transaction.");
            prop_assert_eq!(parsed.bought.is_some(), transaction);
            // Only an adjustment that moves money (an approved refund, a chargeback, a
            // chargeback reversed) is a payment event, and it names its adjustment: as a
            // withdrawal or as a reversal, never both.
            let adjustment = event["event_type"].as_str().unwrap().starts_with("adjustment.");
            prop_assert_eq!(parsed.refund.is_some() || parsed.reversal.is_some(), adjustment);
            prop_assert!(!(parsed.refund.is_some() && parsed.reversal.is_some()));
            if let Some(reversal) = &parsed.reversal {
                prop_assert_eq!(event["data"]["action"].as_str(), Some("chargeback_reverse"));
                prop_assert!(reversal.id.starts_with("adjustment:"));
            }
        }
    }
}
