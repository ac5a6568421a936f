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
use super::signing::{SignatureError, any_signature_matches, mac};
use crate::domain::{
    CapturedPart, ParsedEvent, PaymentEvent, PaymentStatus, Provider, Refund, Reversal,
};
use crate::settings::Capture;

/// The fields an item's signature covers, in their order.
pub const SIGNED_FIELDS: [&str; 8] = [
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

/// The text an item's signature covers, or `None` when its fields are not in a shape
/// that names them unambiguously. The fields are joined with `:` and nothing marks where
/// one ends, so a colon inside one would let a signature made for one set of fields
/// verify another: `merchantReference` `cap:99999` with `value` 400 signs exactly what
/// `merchantReference` `cap`, `value` 99999 and `currency` `400:EUR` sign. Only
/// `merchantReference` (the merchant's own text) may hold a colon, every other field
/// holding none; `value`, when there is one, is a JSON integer (a string `"400"` signs
/// as the number 400 does, but is no amount) and `currency` three capital letters (null
/// or empty, either signs as a missing one, and is read as one). Adyen sends nothing
/// else; such an item is refused, as if its signature did not hold.
fn signed_text(item: &Map<String, Value>) -> Option<String> {
    let amount = |name| {
        item.get("amount")
            .and_then(|a| a.get(name))
            .filter(|v| !v.is_null() && v.as_str() != Some(""))
    };
    let value_is_integer = amount("value").is_none_or(|v| v.as_i64().is_some());
    let currency_is_iso =
        amount("currency").is_none_or(|c| c.as_str().is_some_and(is_currency_code));
    let fields = SIGNED_FIELDS.map(|name| field(item, name));
    let unambiguous = SIGNED_FIELDS
        .iter()
        .zip(&fields)
        .all(|(name, text)| *name == "merchantReference" || !text.contains(':'));
    (value_is_integer && currency_is_iso && unambiguous).then(|| fields.join(":"))
}

/// An ISO 4217 code as Adyen writes it: three capital letters.
fn is_currency_code(code: &str) -> bool {
    code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase())
}

fn key(secret: &str) -> Option<Vec<u8>> {
    hex::decode(secret).ok()
}

/// Verifies every item of a batch: one item without a matching signature under any
/// configured key refuses the whole delivery, so none of it is applied. An empty batch
/// signs nothing and is refused as unsigned.
pub fn verify_adyen(body: &[u8], secrets: &[SecretString]) -> Result<(), SignatureError> {
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
        let text = signed_text(item).ok_or(SignatureError::Invalid)?;
        any_signature_matches(keys.iter().cloned(), &[text.as_bytes()], &[signature])?;
    }
    Ok(())
}

/// The `hmacSignature` of one item under a hex key, if its fields can be signed
/// unambiguously (`signed_text`).
fn item_signature(key: &[u8], item: &Map<String, Value>) -> Option<String> {
    let text = signed_text(item)?;
    Some(BASE64.encode(mac(key, &[text.as_bytes()]).finalize().into_bytes()))
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
        let signature = item_signature(&key, item).ok_or_else(|| {
            EventError("an item's signed fields hold a colon or a malformed amount".to_owned())
        })?;
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
/// event id is `eventCode:pspReference:success` (`…#eventDate` for one ignored for its
/// unsigned date); its account is `merchantAccountCode`.
/// `capture` says which item is the payment's success: the `AUTHORISATION` (automatic
/// capture) or the `CAPTURE` (manual capture, the authorisation only processing).
pub fn parse_adyen(
    provider: &Provider,
    body: &[u8],
    max_quantity: u32,
    capture: Capture,
) -> Result<Vec<ParsedEvent>, EventError> {
    let items = batch(body).map_err(|e| EventError(format!("not an Adyen batch: {e}")))?;
    Ok(items
        .iter()
        .map(|item| parse_item(provider, item, max_quantity, capture))
        .collect())
}

fn parse_item(
    provider: &Provider,
    item: &Map<String, Value>,
    max_quantity: u32,
    capture: Capture,
) -> ParsedEvent {
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
        reported_at: None,
        release: None,
    };
    // Money that came back, against the withdrawal of the same pspReference: a failed
    // or reversed refund names the refund's, a reversed chargeback the chargeback's. Its
    // amount is signed; `eventDate` is not, so nothing depends on it but the version.
    let reversal = |kind: &str| {
        value.map(|amount| Reversal {
            id: format!("{kind}:{psp}"),
            amount,
            of: Some(format!("{kind}:{psp}")),
            at: None,
            since: None,
        })
    };
    // The card scheme rejected a capture: the money it was to take never came, a
    // withdrawal of its own (the capture's amount; all of the payment when it names
    // none). Money, not only a status: a refund's failure later gives back the refund,
    // never this, in whatever order the three arrive.
    let uncaptured = (code == "CAPTURE_FAILED")
        .then(|| refund("capture_failed", value.is_none().then_some(true)));
    let manual = capture == Capture::Manual;
    let (status, payment, refund) = match (code.as_str(), succeeded) {
        ("AUTHORISATION", true) if manual => (PaymentStatus::Processing, &psp, None),
        ("AUTHORISATION", true) => (PaymentStatus::Succeeded, &psp, None),
        ("AUTHORISATION", false) => (PaymentStatus::Failed, &psp, None),
        ("CAPTURE", true) if manual => (PaymentStatus::Succeeded, &original, None),
        ("CAPTURE", true) => {
            return ignored("captured automatically: the AUTHORISATION was the success");
        }
        // The card scheme rejected the capture, after a CAPTURE that succeeded (manual
        // capture) or an AUTHORISATION (automatic): the money never came.
        ("CAPTURE_FAILED", _) => (PaymentStatus::Failed, &original, None),
        // A cancellation by the payment's reference, or by the merchant's own
        // (`TECHNICAL_CANCEL`, when the payment's reference never reached the merchant).
        ("CANCELLATION" | "TECHNICAL_CANCEL", true) => (PaymentStatus::Canceled, &original, None),
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
        // The issuer disputes again after a reversed chargeback and the money is taken
        // back a second time: a withdrawal of its own, which the first reversal (of
        // the first chargeback) does not offset.
        ("SECOND_CHARGEBACK", _) => (
            PaymentStatus::Refunded,
            &original,
            Some(refund("second_chargeback", Some(true))),
        ),
        // Money back moves no state of its own (the status is a standing payment's):
        // the reversal is recorded and the money decides. Like the chargeback, a
        // reversed chargeback counts whatever its `success` says.
        ("CHARGEBACK_REVERSED", _) | ("REFUND_FAILED" | "REFUNDED_REVERSED", true) => {
            if value.is_none() {
                return ignored("a reversal without amount.value");
            }
            (PaymentStatus::Succeeded, &original, None)
        }
        (_, false) => return ignored("the operation did not succeed"),
        _ => return ignored("unhandled event code"),
    };
    let reversal = match code.as_str() {
        "CHARGEBACK_REVERSED" => reversal("chargeback"),
        "REFUND_FAILED" | "REFUNDED_REVERSED" => reversal("refund"),
        _ => None,
    };
    if payment.is_empty() {
        // A modification names its payment by `originalReference`, which Adyen leaves
        // out of some dispute stages unless the webhook is set to include it. Loud, and
        // recorded apart from the item's id: its money cannot be applied without it.
        let reason = "no originalReference, so no payment (for a dispute stage: enable the dispute's originalReference in the webhook's additional settings)";
        tracing::error!(event_code = %code, psp_reference = %psp, "an Adyen item names no payment (originalReference)");
        return ignored(reason).ignored_apart("originalReference", reason);
    }
    let account = field(item, "merchantAccountCode");
    let Some(key) = payment_key(provider, &account, Some(payment)) else {
        return ignored("invalid merchantAccountCode or payment reference");
    };
    // A failed capture and a cancellation outrank every success, whatever the dates:
    // Adyen signs no date, and an AUTHORISATION or CAPTURE signed once and sent again
    // (once its dedupe record expired) with a later `eventDate` would otherwise make the
    // payment succeeded again, and bring back the tokens the failure took, with no money
    // behind them; dated later than a cancellation still to come, it would make that
    // cancellation stale. Adyen never reverses a cancellation, and a capture retried
    // after a failure is settled by the operator.
    let rank = match code.as_str() {
        "CAPTURE_FAILED" | "CANCELLATION" | "TECHNICAL_CANCEL" => PaymentStatus::Refunded.rank(),
        _ => status.rank(),
    };
    let Some((version, date)) = DateTime::parse_from_rfc3339(&field(item, "eventDate"))
        .ok()
        .and_then(|date| Some((ranked_version(rank, date.timestamp())?, date)))
    else {
        // `eventDate` is not signed: an item with it altered must not pass for the item.
        let reason = "eventDate is missing or not an ISO 8601 time";
        return ignored(reason).ignored_apart("eventDate", reason);
    };
    // The token parameters and the payment's date are the authorisation's, also under
    // manual capture, where the payment keeps them until its CAPTURE.
    let authorised = code == "AUTHORISATION" && succeeded;
    // Under manual capture a payment may be captured in parts, each a CAPTURE of its own.
    let captures = manual && code == "CAPTURE" && succeeded;
    ParsedEvent::Payment(Box::new(PaymentEvent {
        event_id: event_id.clone(),
        event_type: code.clone(),
        key,
        status,
        version,
        token_params: item
            .get("additionalData")
            .and_then(Value::as_object)
            .filter(|_| authorised)
            .and_then(|data| tokenmint_params(data, "metadata.", max_quantity)),
        payment_date: authorised.then(|| date.to_utc()),
        // A refund's, chargeback's or reversal's amount is its own, not the payment's; a
        // capture's is its part of the payment (`capture`), and a failed capture's the
        // part it never took (`uncaptured`).
        amount: value.filter(|_| {
            refund.is_none() && reversal.is_none() && !captures && uncaptured.is_none()
        }),
        currency: Some(field(item, "currency"))
            .filter(|c| !c.is_empty() && refund.is_none() && reversal.is_none()),
        refund,
        reversal,
        capture: value.filter(|_| captures).map(|amount| CapturedPart {
            id: format!("capture:{psp}"),
            amount,
        }),
        uncaptured,
        authorises_capture: authorised && status == PaymentStatus::Processing,
        // Only the authorisation carries `metadata.*`, unsigned: a replay of it (its
        // dedupe record expired) is the only way any other metadata could arrive.
        sole_metadata: authorised,
        customer_metadata: false,
        bought: None,
    }))
}

#[cfg(test)]
mod tests;
