//! Adyen: a batch signed with `sign_adyen` verifies under its key, among rotated ones; a
//! change to any signed field of any item, or to any item's signature, refuses the whole
//! batch; and no body, however malformed, panics the verifier or the parser.
//!
//! Adyen signs fields, not bytes (`pspReference`, `originalReference`,
//! `merchantAccountCode`, `merchantReference`, `amount.value`, `amount.currency`,
//! `eventCode`, `success`): a change elsewhere in the body, or to its layout, keeps the
//! signature valid by design, so the tampering here is of those fields.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use tokenmint::domain::{ParsedEvent, Provider};
use tokenmint::settings::Capture;
use tokenmint::webhooks::adyen::{SIGNED_FIELDS, parse_adyen, sign_adyen, verify_adyen};
use tokenmint::webhooks::signature::SignatureError;

use crate::secrets::adyen_secret;
use crate::{bytes, check_payment_event, field, json_value, secrets, tokenmint_metadata};

/// Verifies an Adyen delivery under `keys`.
fn adyen(body: &[u8], keys: &[&str]) -> Result<(), SignatureError> {
    verify_adyen(body, &secrets(keys))
}

/// One notification item with every signed field present (strings, `amount.value` a
/// number), of a handled event code or not, with or without tokenmint's metadata. Only
/// `merchantReference` may hold a colon: anywhere else it would make the signed text
/// name its fields ambiguously, and the item is refused (`verify_adyen`).
fn adyen_item() -> impl Strategy<Value = Value> {
    let event_code = prop_oneof![
        Just("AUTHORISATION"),
        Just("CANCELLATION"),
        Just("REFUND"),
        Just("CANCEL_OR_REFUND"),
        Just("CHARGEBACK"),
        Just("CAPTURE"),
        Just("CAPTURE_FAILED"),
        Just("REPORT_AVAILABLE"),
    ];
    let event_date = prop_oneof![
        4 => "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][1-9]T[01][0-9]:[0-5][0-9]:[0-5][0-9](Z|[+-]0[0-9]:00)",
        1 => ".{0,30}",
    ];
    (
        (
            "[A-Z0-9]{16}",
            "[A-Z0-9]{0,16}",
            "[A-Za-z0-9_.$ -]{0,70}",
            ".{0,30}",
        ),
        (
            0i64..1_000_000_000_000,
            "[A-Z]{3}",
            event_code,
            any::<bool>(),
        ),
        event_date,
        tokenmint_metadata("metadata."),
    )
        .prop_map(
            |(
                (psp, original, account, reference),
                (value, currency, code, success),
                date,
                metadata,
            )| {
                json!({
                    "pspReference": psp, "originalReference": original,
                    "merchantAccountCode": account, "merchantReference": reference,
                    "amount": {"value": value, "currency": currency},
                    "eventCode": code, "success": success.to_string(), "eventDate": date,
                    "additionalData": metadata,
                })
            },
        )
}

/// A delivery of one to four items, unsigned.
fn adyen_batch() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(adyen_item(), 1..=4).prop_map(|items| {
        let items: Vec<Value> = items
            .into_iter()
            .map(|item| json!({ "NotificationRequestItem": item }))
            .collect();
        serde_json::to_vec(&json!({ "live": "false", "notificationItems": items })).unwrap()
    })
}

/// Item `index` (wrapping) of a batch, for changing it in place.
fn item(batch: &mut Value, index: prop::sample::Index) -> &mut Map<String, Value> {
    let items = batch["notificationItems"].as_array_mut().unwrap();
    let at = index.index(items.len());
    items[at]["NotificationRequestItem"]
        .as_object_mut()
        .unwrap()
}

/// Changes what `name` contributes to the item's signed text.
fn tamper(item: &mut Map<String, Value>, name: &str) {
    match name {
        "value" => {
            let value = &mut item["amount"]["value"];
            *value = json!(value.as_i64().unwrap() + 1);
        }
        "currency" => item["amount"]["currency"] = json!("XXXX"),
        "success" => {
            let flipped = if item["success"] == "true" {
                "false"
            } else {
                "true"
            };
            item["success"] = json!(flipped);
        }
        _ => {
            let text = format!("{}x", item[name].as_str().unwrap());
            item[name] = json!(text);
        }
    }
}

proptest! {
    #[test]
    fn adyen_signed_batch_verifies_only_under_its_key(
        secret in adyen_secret(),
        other_secret in adyen_secret(),
        batch in adyen_batch(),
    ) {
        let signed = sign_adyen(&secret, &batch).unwrap();
        prop_assert_eq!(adyen(&signed, &[&secret]), Ok(()));
        // Among rotated keys, in any position.
        prop_assert_eq!(adyen(&signed, &[&other_secret, &secret]), Ok(()));
        if other_secret != secret {
            prop_assert_eq!(adyen(&signed, &[&other_secret]), Err(SignatureError::Invalid));
        }
        // Unsigned, it is refused as such.
        prop_assert_eq!(adyen(&batch, &[&secret]), Err(SignatureError::Missing));
    }

    #[test]
    fn adyen_any_change_to_a_signed_field_or_a_signature_is_refused(
        secret in adyen_secret(),
        batch in adyen_batch(),
        which in any::<prop::sample::Index>(),
        name in prop::sample::select(&SIGNED_FIELDS[..]),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let signed: Value = serde_json::from_slice(&sign_adyen(&secret, &batch).unwrap()).unwrap();
        // One signed field of one item changed.
        let mut changed = signed.clone();
        tamper(item(&mut changed, which), name);
        let changed = serde_json::to_vec(&changed).unwrap();
        prop_assert_eq!(adyen(&changed, &[&secret]), Err(SignatureError::Invalid));
        // One byte of one item's signature changed.
        let mut forged = signed;
        let data = &mut item(&mut forged, which)["additionalData"];
        let mut signature = BASE64.decode(data["hmacSignature"].as_str().unwrap()).unwrap();
        let byte = at.index(signature.len());
        signature[byte] ^= flip;
        data["hmacSignature"] = json!(BASE64.encode(signature));
        let forged = serde_json::to_vec(&forged).unwrap();
        prop_assert_eq!(adyen(&forged, &[&secret]), Err(SignatureError::Invalid));
    }

    #[test]
    fn adyen_never_panics_on_bytes_or_json(
        body in bytes(512),
        value in json_value(),
        key in prop_oneof![any::<String>(), adyen_secret()],
        max in any::<u32>(),
    ) {
        let provider = Provider::parse("adyen").unwrap();
        for body in [body, serde_json::to_vec(&value).unwrap()] {
            let _ = adyen(&body, &[&key]);
            for capture in [Capture::Auto, Capture::Manual] {
                let _ = parse_adyen(&provider, &body, max, capture);
            }
            let _ = sign_adyen(&key, &body);
        }
    }

    #[test]
    fn adyen_items_parse_to_valid_keys(
        items in prop::collection::vec(field(adyen_item()), 0..4),
        max in 1u32..=1000,
        manual in any::<bool>(),
    ) {
        let provider = Provider::parse("adyen").unwrap();
        let capture = if manual { Capture::Manual } else { Capture::Auto };
        let items: Vec<Value> =
            items.into_iter().map(|item| json!({ "NotificationRequestItem": item })).collect();
        let body = serde_json::to_vec(&json!({ "notificationItems": items })).unwrap();
        // A batch is read whole or refused whole; each of its items parses on its own.
        if let Ok(events) = parse_adyen(&provider, &body, max, capture) {
            prop_assert_eq!(events.len(), items.len());
            for event in events {
                if let ParsedEvent::Payment(parsed) = event {
                    check_payment_event(&parsed, max)?;
                }
            }
        }
    }
}
