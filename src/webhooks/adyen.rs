//! Adyen standard notifications. One delivery is a batch,
//! `{live, notificationItems: [{NotificationRequestItem: {…}}]}`, and each item is an
//! event of its own carrying its own signature in `additionalData.hmacSignature`:
//! base64(HMAC-SHA256(hex-decoded key, `pspReference:originalReference:
//! merchantAccountCode:merchantReference:value:currency:eventCode:success`)), a missing
//! field signed as an empty string. The signature is over fields, not over the raw bytes,
//! so verifying means reading the batch first; nothing else is read before every item's
//! signature holds. Adyen signs no timestamp: replays are stopped by the event ids alone.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::DateTime;
use hmac::Mac;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::events::{EventError, payment_key, ranked_version, tokenmint_params};
use super::signature::{SignatureError, SignatureHeaders, any_signature_matches, mac};
use crate::domain::{ParsedEvent, PaymentEvent, PaymentStatus, Provider, Refund};

/// The fields an item's signature covers, in their order.
const SIGNED_FIELDS: [&str; 8] = [
    "pspReference",
    "originalReference",
    "merchantAccountCode",
    "merchantReference",
    "value",
    "currency",
    "eventCode",
    "success",
];
/// The HMAC key sizes accepted, in bytes once hex-decoded (Adyen's are 32).
pub const ADYEN_KEY_BYTES: std::ops::RangeInclusive<usize> = 32..=128;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Batch {
    notification_items: Vec<Wrapped>,
}

#[derive(Deserialize)]
struct Wrapped {
    #[serde(rename = "NotificationRequestItem")]
    item: Map<String, Value>,
}

/// The batch's items. Only the documented shape: serde would also read a struct from a
/// JSON array (`[[…]]`), which Adyen never sends and which nothing downstream expects.
fn batch(body: &[u8]) -> Result<Vec<Map<String, Value>>, serde_json::Error> {
    let value: Value = serde_json::from_slice(body)?;
    let objects = |v: &Value| v.is_object();
    let shaped = objects(&value)
        && value
            .get("notificationItems")
            .and_then(Value::as_array)
            .is_none_or(|items| items.iter().all(objects));
    if !shaped {
        return Err(serde::de::Error::custom(
            "a batch is an object whose notificationItems are objects",
        ));
    }
    let batch: Batch = serde_json::from_value(value)?;
    Ok(batch
        .notification_items
        .into_iter()
        .map(|w| w.item)
        .collect())
}

/// A field as Adyen renders it into the signed text: strings as they are, numbers and
/// booleans in JSON form, anything missing as the empty string. `value` and `currency`
/// are read from the item's `amount`.
fn field(item: &Map<String, Value>, name: &str) -> String {
    let value = match name {
        "value" | "currency" => item.get("amount").and_then(|a| a.get(name)),
        _ => item.get(name),
    };
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn signed_text(item: &Map<String, Value>) -> String {
    SIGNED_FIELDS.map(|name| field(item, name)).join(":")
}

fn key(secret: &str) -> Option<Vec<u8>> {
    hex::decode(secret).ok()
}

/// Verifies every item of a batch: one item without a matching signature under any
/// configured key refuses the whole delivery, so none of it is applied. An empty batch
/// signs nothing and is refused as unsigned.
pub fn verify_adyen(
    _headers: &SignatureHeaders<'_>,
    body: &[u8],
    secrets: &[SecretString],
    _tolerance_secs: u64,
    _now: i64,
) -> Result<(), SignatureError> {
    let items = batch(body).map_err(|_| SignatureError::Invalid)?;
    if items.is_empty() {
        return Err(SignatureError::Missing);
    }
    // Every configured key decodes (`check_secret` ran at startup).
    let keys: Vec<Vec<u8>> = secrets
        .iter()
        .filter_map(|s| key(s.expose_secret()))
        .collect();
    for item in &items {
        let signature = item
            .get("additionalData")
            .and_then(|d| d.get("hmacSignature"))
            .and_then(Value::as_str)
            .ok_or(SignatureError::Missing)?;
        let signature = BASE64
            .decode(signature)
            .map_err(|_| SignatureError::Invalid)?;
        any_signature_matches(
            keys.iter().cloned(),
            &[signed_text(item).as_bytes()],
            &[signature],
        )?;
    }
    Ok(())
}

/// The `hmacSignature` of one item under a hex key.
fn item_signature(key: &[u8], item: &Map<String, Value>) -> String {
    BASE64.encode(
        mac(key, &[signed_text(item).as_bytes()])
            .finalize()
            .into_bytes(),
    )
}

/// Signs like Adyen does: `body` with `additionalData.hmacSignature` set in every item;
/// for tests and `webhooks sign`.
pub fn sign_adyen(secret: &str, body: &[u8]) -> Result<Vec<u8>, EventError> {
    let key = key(secret).ok_or_else(|| EventError("the key is not hex".to_owned()))?;
    let not_batch = |e: &dyn std::fmt::Display| EventError(format!("not an Adyen batch: {e}"));
    batch(body).map_err(|e| not_batch(&e))?;
    let mut batch: Value = serde_json::from_slice(body).map_err(|e| not_batch(&e))?;
    let items = batch
        .get_mut("notificationItems")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for wrapped in items {
        let Some(item) = wrapped
            .get_mut("NotificationRequestItem")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let signature = item_signature(&key, item);
        let data = item
            .entry("additionalData")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(data) = data.as_object_mut() {
            data.insert("hmacSignature".to_owned(), Value::String(signature));
        }
    }
    serde_json::to_vec(&batch).map_err(|e| not_batch(&e))
}

/// An Adyen HMAC key: hex, an even number of digits, 32 to 128 bytes decoded.
pub(super) fn check_secret(secret: &str) -> Result<(), &'static str> {
    match key(secret) {
        Some(key) if ADYEN_KEY_BYTES.contains(&key.len()) => Ok(()),
        Some(_) => Err("must be the HMAC key in hex, 32 to 128 bytes (64 to 256 hex digits)"),
        None => Err("must be the HMAC key in hex (an even number of 0-9, A-F digits)"),
    }
}

/// Parses a verified batch into one event per item, in the batch's order. Each item's
/// event id is `eventCode:pspReference:success`; its account is `merchantAccountCode`.
pub fn parse_adyen(
    provider: &Provider,
    body: &[u8],
    max_quantity: u32,
) -> Result<Vec<ParsedEvent>, EventError> {
    let items = batch(body).map_err(|e| EventError(format!("not an Adyen batch: {e}")))?;
    Ok(items
        .iter()
        .map(|item| parse_item(provider, item, max_quantity))
        .collect())
}

fn parse_item(provider: &Provider, item: &Map<String, Value>, max_quantity: u32) -> ParsedEvent {
    let code = field(item, "eventCode");
    let psp = field(item, "pspReference");
    let succeeded = field(item, "success") == "true";
    let event_id = format!("{code}:{psp}:{}", field(item, "success"));
    let ignored = |reason: &str| ParsedEvent::Ignored {
        event_id: event_id.clone(),
        event_type: code.clone(),
        reason: reason.to_owned(),
    };
    let original = field(item, "originalReference");
    let value = item
        .get("amount")
        .and_then(|a| a.get("value"))
        .and_then(Value::as_i64);
    let refund = |kind: &str, full: Option<bool>| Refund {
        id: format!("{kind}:{psp}"),
        amount: value,
        full,
    };
    let (status, payment, refund) = match (code.as_str(), succeeded) {
        ("AUTHORISATION", true) => (PaymentStatus::Succeeded, &psp, None),
        ("AUTHORISATION", false) => (PaymentStatus::Failed, &psp, None),
        ("CANCELLATION", true) => (PaymentStatus::Canceled, &original, None),
        // The amount decides whether a refund is partial.
        ("REFUND", true) => (
            PaymentStatus::Refunded,
            &original,
            Some(refund("refund", None)),
        ),
        // Either a cancellation or a full refund: the payment is withdrawn whole.
        ("CANCEL_OR_REFUND", true) => (
            PaymentStatus::Refunded,
            &original,
            Some(refund("refund", Some(true))),
        ),
        // A chargeback takes the whole payment back, whatever its `success` says.
        ("CHARGEBACK", _) => (
            PaymentStatus::Refunded,
            &original,
            Some(refund("chargeback", Some(true))),
        ),
        (_, false) => return ignored("the operation did not succeed"),
        _ => return ignored("unhandled event code"),
    };
    let account = field(item, "merchantAccountCode");
    let Some(key) = payment_key(provider, &account, Some(payment)) else {
        return ignored("invalid merchantAccountCode or payment reference");
    };
    let Some((version, date)) = DateTime::parse_from_rfc3339(&field(item, "eventDate"))
        .ok()
        .and_then(|date| Some((ranked_version(status.rank(), date.timestamp())?, date)))
    else {
        return ignored("eventDate is missing or not an ISO 8601 time");
    };
    let authorised = status == PaymentStatus::Succeeded;
    ParsedEvent::Payment(PaymentEvent {
        event_id: event_id.clone(),
        event_type: code.clone(),
        key,
        status,
        version,
        // A refund's or chargeback's amount is its own, not the payment's.
        amount: value.filter(|_| refund.is_none()),
        currency: Some(field(item, "currency")).filter(|c| !c.is_empty() && refund.is_none()),
        token_params: item
            .get("additionalData")
            .and_then(Value::as_object)
            .filter(|_| authorised)
            .and_then(|data| tokenmint_params(data, "metadata.", max_quantity)),
        payment_date: authorised.then(|| date.to_utc()),
        refund,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_documented_batch_shape_is_read() {
        let key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
        assert!(super::sign_adyen(key, br#"{"notificationItems": []}"#).is_ok());
        for body in [
            &b"[[]]"[..],
            b"[]",
            b"{\"notificationItems\": [[]]}",
            b"{\"notificationItems\": [1]}",
        ] {
            assert!(
                super::sign_adyen(key, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
            assert!(super::batch(body).is_err());
        }
    }

    use serde_json::json;

    use super::*;

    /// The key and item of the HMAC test in Adyen's own PHP library.
    const LIBRARY_KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

    fn library_item(signature: Option<&str>) -> Value {
        let mut item = json!({
            "pspReference": "7914073381342284",
            "merchantAccountCode": "TestMerchant",
            "merchantReference": "TestPayment-1407325143704",
            "amount": { "value": 1130, "currency": "EUR" },
            "eventCode": "AUTHORISATION",
            "success": "true",
            "eventDate": "2026-11-30T10:00:00+01:00",
        });
        if let Some(signature) = signature {
            item["additionalData"] = json!({ "hmacSignature": signature });
        }
        item
    }

    fn batch_of(items: &[Value]) -> Vec<u8> {
        let items: Vec<Value> = items
            .iter()
            .map(|i| json!({ "NotificationRequestItem": i }))
            .collect();
        json!({ "live": "false", "notificationItems": items })
            .to_string()
            .into_bytes()
    }

    fn verify(body: &[u8], keys: &[&str]) -> Result<(), SignatureError> {
        let secrets: Vec<SecretString> = keys.iter().map(|k| (*k).into()).collect();
        verify_adyen(&SignatureHeaders::default(), body, &secrets, 300, 0)
    }

    const KNOWN: &str = "Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I=";

    #[test]
    fn known_answer_from_adyens_library() {
        let item = library_item(None);
        assert_eq!(
            signed_text(item.as_object().unwrap()),
            "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
        );
        let key = hex::decode(LIBRARY_KEY).unwrap();
        assert_eq!(item_signature(&key, item.as_object().unwrap()), KNOWN);
        assert_eq!(
            verify(&batch_of(&[library_item(Some(KNOWN))]), &[LIBRARY_KEY]),
            Ok(())
        );
        let signed = sign_adyen(LIBRARY_KEY, &batch_of(&[item])).unwrap();
        assert_eq!(verify(&signed, &[LIBRARY_KEY]), Ok(()));
    }

    #[test]
    fn one_bad_item_refuses_the_batch() {
        let other = "00".repeat(32);
        let good = library_item(Some(KNOWN));
        let mut tampered = good.clone();
        tampered["amount"]["value"] = json!(1);
        assert_eq!(
            verify(&batch_of(&[good.clone(), tampered]), &[LIBRARY_KEY]),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify(
                &batch_of(&[good.clone(), library_item(None)]),
                &[LIBRARY_KEY]
            ),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify(&batch_of(std::slice::from_ref(&good)), &[&other]),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verify(&batch_of(&[good]), &[&other, LIBRARY_KEY]),
            Ok(()),
            "rotation"
        );
        assert_eq!(
            verify(&batch_of(&[]), &[LIBRARY_KEY]),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify(b"[accepted]", &[LIBRARY_KEY]),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn keys_are_hex_of_32_to_128_bytes() {
        assert_eq!(check_secret(LIBRARY_KEY), Ok(()));
        assert_eq!(check_secret(&"ab".repeat(128)), Ok(()));
        for secret in [
            "ab".repeat(31),
            "ab".repeat(129),
            format!("{LIBRARY_KEY}0"),
            "zz".repeat(32),
        ] {
            let problem = check_secret(&secret).unwrap_err();
            assert!(!problem.contains(&secret), "{secret}");
        }
    }

    #[test]
    fn items_become_events() {
        let provider = Provider::parse("adyen").unwrap();
        let mut authorised = library_item(None);
        authorised["additionalData"] = json!({
            "metadata.tokenmint_owner": "65f1a0c2b3d4e5f601234567",
            "metadata.tokenmint_token_type": "standard",
            "metadata.tokenmint_quantity": "3",
        });
        let refund = json!({ "eventCode": "REFUND", "success": "true", "pspReference": "R1",
            "originalReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
            "amount": { "value": 500, "currency": "EUR" }, "eventDate": "2026-11-30T09:00:00Z" });
        let report =
            json!({ "eventCode": "REPORT_AVAILABLE", "success": "true", "pspReference": "X" });
        let events = parse_adyen(&provider, &batch_of(&[authorised, refund, report]), 100).unwrap();
        let ParsedEvent::Payment(first) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(first.event_id, "AUTHORISATION:7914073381342284:true");
        assert_eq!(first.key.account_id.as_str(), "TestMerchant");
        assert_eq!(
            (first.amount, first.status),
            (Some(1130), PaymentStatus::Succeeded)
        );
        assert_eq!(
            first.token_params.clone().unwrap().unwrap().quantity.get(),
            3
        );
        let ParsedEvent::Payment(second) = &events[1] else {
            panic!("{events:?}")
        };
        assert_eq!(second.key.payment_intent_id.as_str(), "7914073381342284");
        assert_eq!(second.amount, None);
        assert_eq!(second.refund.as_ref().unwrap().id, "refund:R1");
        assert!(second.version > first.version);
        assert!(matches!(events[2], ParsedEvent::Ignored { .. }));
    }
}
