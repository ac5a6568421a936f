//! Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`
//! (space-separated `v1,<base64>`), HMAC-SHA256 of `"{id}.{timestamp}.{raw body}"` keyed
//! with the base64 after `whsec_`, and its provider-neutral payment events.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use hmac::Mac;
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::events::{EventError, payment_key, token_params};
use super::signing::{SignatureError, SignatureHeaders, Verification, any_signature_matches, mac};
use crate::domain::{ParsedEvent, PaymentEvent, PaymentStatus, Provider, Refund, Reversal};

/// The smallest and largest Standard Webhooks key, in bytes (the specification's range).
pub const STANDARD_KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature` (space-separated
/// `v1,<base64>`), HMAC of `"{id}.{timestamp}.{body}"` keyed with the base64 after `whsec_`.
pub fn verify_standard(
    headers: &SignatureHeaders<'_>,
    body: &[u8],
    check: &Verification<'_>,
) -> Result<(), SignatureError> {
    let id = headers.webhook_id.ok_or(SignatureError::Missing)?;
    let timestamp_text = headers.webhook_timestamp.ok_or(SignatureError::Missing)?;
    let header = headers.webhook_signature.ok_or(SignatureError::Missing)?;
    let timestamp = timestamp_text
        .parse::<i64>()
        .map_err(|_| SignatureError::Invalid)?;
    check.within(timestamp)?;
    let signatures: Vec<Vec<u8>> = header
        .split_whitespace()
        .filter_map(|item| item.strip_prefix("v1,"))
        .filter_map(|sig| BASE64.decode(sig).ok())
        .collect();
    if signatures.is_empty() {
        return Err(SignatureError::Invalid);
    }
    // Every configured secret decodes (`check_secret` ran at startup); one that does not
    // could not match anything anyway.
    let keys = check
        .secrets
        .iter()
        .filter_map(|s| standard_key(s.expose_secret()));
    any_signature_matches(
        keys,
        &[id.as_bytes(), b".", timestamp_text.as_bytes(), b".", body],
        &signatures,
    )
}

/// The HMAC key of a `whsec_<base64>` secret: `None` without the prefix or when the rest
/// is not base64. Configured secrets are checked with [`check_secret`] at startup, so
/// every one of them decodes here.
pub fn standard_key(secret: &str) -> Option<Vec<u8>> {
    BASE64.decode(secret.strip_prefix("whsec_")?).ok()
}

/// A Standard Webhooks secret: `whsec_` and the base64 of a 24 to 64 byte key.
pub(super) fn check_secret(secret: &str) -> Result<(), &'static str> {
    match standard_key(secret) {
        Some(key) if STANDARD_KEY_BYTES.contains(&key.len()) => Ok(()),
        Some(_) => Err("must be `whsec_` followed by the base64 of a 24 to 64 byte key"),
        None => Err("must be `whsec_` followed by standard base64 (with padding)"),
    }
}

/// Signs like a Standard Webhooks sender; for tests and `webhooks sign`.
pub fn sign_standard(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = standard_key(secret).unwrap_or_default();
    let tag = mac(
        &key,
        &[
            id.as_bytes(),
            b".",
            timestamp.to_string().as_bytes(),
            b".",
            body,
        ],
    )
    .finalize()
    .into_bytes();
    format!("v1,{}", BASE64.encode(tag))
}

#[derive(Deserialize)]
struct StandardEvent {
    #[serde(rename = "type")]
    event_type: String,
    data: Map<String, Value>,
}

/// Parses a Standard Webhooks event; its id is the `webhook-id` header.
pub fn parse_standard(
    provider: &Provider,
    event_id: &str,
    body: &[u8],
    max_quantity: u32,
) -> Result<ParsedEvent, EventError> {
    let event: StandardEvent = serde_json::from_slice(body)
        .map_err(|e| EventError(format!("not a payment event: {e}")))?;
    let ignored = |reason: &str| {
        Ok(ParsedEvent::Ignored {
            event_id: event_id.to_owned(),
            event_type: event.event_type.clone(),
            reason: reason.to_owned(),
        })
    };
    let status = match event.event_type.as_str() {
        "payment.processing" => PaymentStatus::Processing,
        "payment.succeeded" => PaymentStatus::Succeeded,
        "payment.failed" => PaymentStatus::Failed,
        "payment.canceled" => PaymentStatus::Canceled,
        "payment.refunded" => PaymentStatus::Refunded,
        // Money coming back moves no state: the money decides.
        "payment.reinstated" => PaymentStatus::Succeeded,
        _ => return ignored("unhandled event type"),
    };
    let data = &event.data;
    let text = |name: &str| data.get(name).and_then(Value::as_str);
    let Some(key) = payment_key(
        provider,
        text("accountId").unwrap_or("default"),
        text("paymentIntentId"),
    ) else {
        return ignored("invalid accountId or paymentIntentId");
    };
    let Some(version) = data.get("version").and_then(Value::as_i64) else {
        return ignored("missing integer version");
    };
    let token_params =
        if text("owner").is_none() && text("tokenType").is_none() && data.get("quantity").is_none()
        {
            None
        } else {
            let quantity = data
                .get("quantity")
                .map(|q| q.as_i64().ok_or_else(|| "must be an integer".to_owned()));
            Some(token_params(
                text("owner"),
                text("tokenType"),
                quantity,
                max_quantity,
                "",
            ))
        };
    // `amountReinstated` is what came back so far, a running total like
    // `amountRefunded`, whose refunds it gives back (never more than them).
    let reversal = match (event.event_type.as_str(), data.get("amountReinstated")) {
        ("payment.reinstated", Some(amount)) => match amount.as_i64() {
            Some(amount) => Some(Reversal {
                id: "total".to_owned(),
                amount,
                of: Some("total".to_owned()),
                at: None,
                since: None,
            }),
            None => return ignored("amountReinstated is not an integer"),
        },
        ("payment.reinstated", None) => {
            return ignored("payment.reinstated without amountReinstated");
        }
        _ => None,
    };
    let payment_date = text("paymentDate")
        .and_then(|d| DateTime::parse_from_rfc3339(d).ok())
        .map(|d| d.with_timezone(&Utc));
    Ok(ParsedEvent::Payment(Box::new(PaymentEvent {
        event_id: event_id.to_owned(),
        event_type: event.event_type.clone(),
        key,
        status,
        version,
        amount: data.get("amount").and_then(Value::as_i64),
        currency: text("currency").map(str::to_owned),
        token_params,
        payment_date,
        // `amountRefunded` is the refunds so far (one running total per payment);
        // without it, `payment.refunded` is a full refund.
        refund: (status == PaymentStatus::Refunded).then(|| {
            let refunded = data.get("amountRefunded").and_then(Value::as_i64);
            Refund {
                id: "total".to_owned(),
                amount: refunded,
                full: refunded.is_none().then_some(true),
                reported_at: None,
                release: None,
            }
        }),
        reversal,
        capture: None,
        uncaptured: None,
        authorises_capture: false,
        sole_metadata: false,
        customer_metadata: false,
        bought: None,
    })))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::webhooks::signing::verify_with;

    const NOW: i64 = 1_780_000_000;

    fn check(
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        keys: &[&str],
        now: i64,
    ) -> Result<(), SignatureError> {
        verify_with(keys, 300, now, |check| {
            verify_standard(headers, body, check)
        })
    }

    #[test]
    fn standard_webhooks_round_trip_and_refusals() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"type":"payment.succeeded"}"#;
        let signature = sign_standard(secret, "msg_1", NOW, body);
        let ts = NOW.to_string();
        let headers = SignatureHeaders {
            webhook_id: Some("msg_1"),
            webhook_timestamp: Some(&ts),
            webhook_signature: Some(&signature),
            ..Default::default()
        };
        assert_eq!(check(&headers, body, &[secret], NOW), Ok(()));
        let both = format!("v1,AAAA {signature}");
        let rotated = SignatureHeaders {
            webhook_signature: Some(&both),
            ..headers
        };
        assert_eq!(check(&rotated, body, &["whsec_AAAA", secret], NOW), Ok(()));
        assert_eq!(
            check(&headers, b"{}", &[secret], NOW),
            Err(SignatureError::Invalid)
        );
        let other_id = SignatureHeaders {
            webhook_id: Some("msg_2"),
            ..headers
        };
        assert_eq!(
            check(&other_id, body, &[secret], NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check(&headers, body, &[secret], NOW + 301),
            Err(SignatureError::OutOfTolerance)
        );
        assert_eq!(
            check(&headers, body, &[secret], NOW - 301),
            Err(SignatureError::OutOfTolerance)
        );
        let missing = SignatureHeaders {
            webhook_id: None,
            ..headers
        };
        assert_eq!(
            check(&missing, body, &[secret], NOW),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn standard_event_versions_and_params() {
        let provider = Provider::parse("acme").unwrap();
        let body = json!({"type": "payment.succeeded", "timestamp": "2026-01-01T00:00:00Z",
            "data": {"paymentIntentId": "pay_1", "version": 5, "owner": "65f1a0c2b3d4e5f601234567", "tokenType": "gold", "quantity": 2}});
        let ParsedEvent::Payment(event) =
            parse_standard(&provider, "msg_1", body.to_string().as_bytes(), 1000).unwrap()
        else {
            panic!()
        };
        assert_eq!(event.version, 5);
        assert_eq!(
            event.token_params.unwrap().unwrap().token_type.as_str(),
            "gold"
        );
        let no_version = json!({"type": "payment.succeeded", "data": {"paymentIntentId": "pay_1"}});
        assert!(matches!(
            parse_standard(&provider, "m", no_version.to_string().as_bytes(), 10).unwrap(),
            ParsedEvent::Ignored { .. }
        ));
    }
}
