//! Provider event bodies, parsed (after the signature check) into one `PaymentEvent`
//! shape. Only the fields of the documented event contract are read; everything else is ignored.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::domain::{
    AccountId, FieldErrors, IssuanceParams, Owner, ParsedEvent, PaymentEvent, PaymentIntentId,
    PaymentKey, PaymentStatus, Provider, Quantity, TokenType,
};

/// Stripe has no object version: (status rank, event `created`) is folded into one
/// integer, rank first. `created` is in seconds, far below this factor.
const STRIPE_RANK_FACTOR: i64 = 10_000_000_000;

/// A body that is not an event at all (the provider's fault: answered 400).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub String);

#[derive(Deserialize)]
struct StripeEvent {
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    created: i64,
    account: Option<String>,
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
    // `created` (unix seconds) is folded into the version below the status rank; outside
    // 0..STRIPE_RANK_FACTOR it would overflow or outrank a higher status.
    if !(0..STRIPE_RANK_FACTOR).contains(&event.created) {
        return Err(EventError(format!(
            "not a Stripe event: created {} is not a unix time in seconds",
            event.created
        )));
    }
    let ignored = |reason: &str| {
        Ok(ParsedEvent::Ignored {
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            reason: reason.to_owned(),
        })
    };
    let object = &event.data.object;
    let (status, payment_id) = match event.event_type.as_str() {
        "payment_intent.processing" => (PaymentStatus::Processing, object.get("id")),
        "payment_intent.succeeded" => (PaymentStatus::Succeeded, object.get("id")),
        "payment_intent.payment_failed" => (PaymentStatus::Failed, object.get("id")),
        "payment_intent.canceled" => (PaymentStatus::Canceled, object.get("id")),
        "charge.refunded" => (PaymentStatus::Refunded, object.get("payment_intent")),
        _ => return ignored("unhandled event type"),
    };
    let account = event.account.as_deref().unwrap_or("default");
    let Some(key) = payment_key(provider, account, payment_id.and_then(Value::as_str)) else {
        return ignored("invalid account or payment id");
    };
    let metadata = object.get("metadata").and_then(Value::as_object);
    let token_params = metadata.and_then(|m| {
        let field = |name: &str| m.get(name).and_then(Value::as_str);
        let owner = field("tokenmint_owner");
        let token_type = field("tokenmint_token_type");
        let quantity = field("tokenmint_quantity");
        if owner.is_none() && token_type.is_none() && quantity.is_none() {
            return None;
        }
        // Metadata values are strings; the quantity must still be a plain integer.
        let quantity = quantity.map(|q| {
            q.parse::<i64>()
                .map_err(|_| "must be an integer".to_owned())
        });
        Some(token_params(
            owner,
            token_type,
            quantity,
            max_quantity,
            "tokenmint_",
        ))
    });
    let payment_date = object
        .get("created")
        .and_then(Value::as_i64)
        .or(Some(event.created))
        .and_then(|secs| DateTime::from_timestamp(secs, 0));
    // A charge fully refunded says `refunded: true`; otherwise `amount_refunded` of its
    // `amount` is a partial refund, whose share `issuing` takes back. A full refund also
    // reports everything refunded, so the refunded amount only ever grows; and it ranks
    // above a partial one, which ranks as the success it leaves standing, so a full refund
    // in the same second as a partial one still wins.
    let fully_refunded = object.get("refunded").and_then(Value::as_bool) == Some(true);
    let (amount_refunded, rank) = match status {
        PaymentStatus::Refunded if fully_refunded => (
            object
                .get("amount_refunded")
                .and_then(Value::as_i64)
                .max(object.get("amount").and_then(Value::as_i64)),
            status.rank(),
        ),
        PaymentStatus::Refunded => match object.get("amount_refunded").and_then(Value::as_i64) {
            Some(refunded) => (Some(refunded), PaymentStatus::Succeeded.rank()),
            None => return ignored("partial refund without amount_refunded"),
        },
        _ => (None, status.rank()),
    };
    Ok(ParsedEvent::Payment(PaymentEvent {
        event_id: event.id,
        event_type: event.event_type,
        key,
        status,
        version: rank * STRIPE_RANK_FACTOR + event.created,
        amount: object.get("amount").and_then(Value::as_i64),
        currency: object
            .get("currency")
            .and_then(Value::as_str)
            .map(str::to_owned),
        token_params,
        payment_date,
        amount_refunded,
    }))
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
    let payment_date = text("paymentDate")
        .and_then(|d| DateTime::parse_from_rfc3339(d).ok())
        .map(|d| d.with_timezone(&Utc));
    Ok(ParsedEvent::Payment(PaymentEvent {
        event_id: event_id.to_owned(),
        event_type: event.event_type.clone(),
        key,
        status,
        version,
        amount: data.get("amount").and_then(Value::as_i64),
        currency: text("currency").map(str::to_owned),
        token_params,
        payment_date,
        // A refund of part of the amount; without it, `payment.refunded` is a full refund.
        amount_refunded: match status {
            PaymentStatus::Refunded => data.get("amountRefunded").and_then(Value::as_i64),
            _ => None,
        },
    }))
}

fn payment_key(provider: &Provider, account: &str, payment: Option<&str>) -> Option<PaymentKey> {
    Some(PaymentKey {
        provider: provider.clone(),
        account_id: AccountId::parse(account).ok()?,
        payment_intent_id: PaymentIntentId::parse(payment?).ok()?,
    })
}

/// Validates the token parameters an event carries; the error lists every bad field.
fn token_params(
    owner: Option<&str>,
    token_type: Option<&str>,
    quantity: Option<Result<i64, String>>,
    max_quantity: u32,
    prefix: &str,
) -> Result<IssuanceParams, String> {
    let mut errors = FieldErrors::default();
    let owner = errors.required(&format!("{prefix}owner"), owner.map(Owner::parse));
    let token_type = errors.required(
        &format!("{prefix}token_type"),
        token_type.map(TokenType::parse),
    );
    let quantity = errors.required(
        &format!("{prefix}quantity"),
        quantity.map(|q| q.and_then(|n| Quantity::from_i64(n, max_quantity))),
    );
    if let Err(list) = errors.finish() {
        return Err(list
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; "));
    }
    match (owner, token_type, quantity) {
        (Some(owner), Some(token_type), Some(quantity)) => Ok(IssuanceParams {
            owner,
            token_type,
            quantity,
        }),
        _ => Err("incomplete token metadata".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stripe() -> Provider {
        Provider::parse("stripe").unwrap()
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
        assert!(
            event.version > PaymentStatus::Processing.rank() * STRIPE_RANK_FACTOR + 1_800_000_000
        );
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
            (event.status, event.amount, event.amount_refunded),
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
            event.amount_refunded,
            Some(40),
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
        for created in [i64::MAX, i64::MIN, -1, STRIPE_RANK_FACTOR] {
            let body = json!({"id": "evt_1", "type": "payment_intent.succeeded", "created": created,
                "data": {"object": {"id": "pi_1"}}});
            assert!(
                parse_stripe(&stripe(), body.to_string().as_bytes(), 10).is_err(),
                "{created}"
            );
        }
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
