//! What parsing provider event bodies (after the signature check) into one
//! `PaymentEvent` shape shares across schemes: the folded version, the payment key, the
//! token parameters. Each scheme's parser reads only the fields of its documented event
//! contract; everything else is ignored.

use serde_json::{Map, Value};

use crate::domain::{
    AccountId, FieldErrors, IssuanceParams, Owner, PaymentIntentId, PaymentKey, Provider, Quantity,
    TokenType,
};

/// Providers without an object version (Stripe, Paddle, Adyen) get one folded from
/// (status rank, event time in unix seconds), rank first. The time stays far below this
/// factor, so a higher rank always wins and, within a rank, the later event.
pub(super) const RANK_FACTOR: i64 = 10_000_000_000;

/// A body that is not an event at all (the provider's fault: answered 400).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub String);

/// The version of an event of `rank` that happened at `secs`; `None` when `secs` is not
/// a unix time in seconds that the fold can hold (it would overflow or outrank a higher
/// status).
pub(super) fn ranked_version(rank: i64, secs: i64) -> Option<i64> {
    EventTime::new(secs).map(|time| time.version(rank))
}

/// An event's time in unix seconds, checked to fit the fold: for a scheme that must refuse
/// an unfoldable time before it knows the event's rank (Stripe's `created`).
#[derive(Debug, Clone, Copy)]
pub(super) struct EventTime(i64);

impl EventTime {
    /// `None` when `secs` would overflow the fold or outrank a higher status.
    pub(super) fn new(secs: i64) -> Option<Self> {
        (0..RANK_FACTOR).contains(&secs).then_some(Self(secs))
    }

    /// The version of an event of `rank` at this time.
    pub(super) fn version(self, rank: i64) -> i64 {
        rank * RANK_FACTOR + self.0
    }

    pub(super) fn secs(self) -> i64 {
        self.0
    }
}

/// The token parameters named by `tokenmint_owner`, `tokenmint_token_type` and
/// `tokenmint_quantity` (each after `prefix`) in a provider's metadata: `None` when none of
/// them is there. Metadata values are strings at most providers; the quantity may also
/// be a JSON integer, but must be a plain integer either way.
pub(super) fn tokenmint_params(
    metadata: &Map<String, Value>,
    prefix: &str,
    max_quantity: u32,
) -> Option<Result<IssuanceParams, String>> {
    let field = |name: &str| metadata.get(&format!("{prefix}tokenmint_{name}"));
    let text = |name: &str| field(name).and_then(Value::as_str);
    let quantity = field("quantity");
    if text("owner").is_none() && text("token_type").is_none() && quantity.is_none() {
        return None;
    }
    let quantity = quantity.map(|q| integer(q).ok_or_else(|| "must be an integer".to_owned()));
    Some(token_params(
        text("owner"),
        text("token_type"),
        quantity,
        max_quantity,
        &format!("{prefix}tokenmint_"),
    ))
}

/// The mode a delivery says it is of, from its top-level `field` (Stripe's `livemode`, a
/// boolean; an Adyen batch's `live`, the string `"true"` or `"false"`, either form
/// read); `None` when it says nothing readable.
pub(super) fn delivery_mode(body: &[u8], field: &str) -> Option<bool> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match value.get(field)? {
        Value::Bool(live) => Some(*live),
        Value::String(live) => live.parse().ok(),
        _ => None,
    }
}

/// The top-level `id` and `type` of an event body (Stripe's shape), when both are strings:
/// enough to record a delivery that is ignored without reading the rest.
pub(super) fn named_event(body: &[u8]) -> Option<(String, String)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let text = |field: &str| value.get(field)?.as_str().map(str::to_owned);
    Some((text("id")?, text("type")?))
}

/// An integer given as a JSON integer or as a string of its digits (providers write
/// amounts and metadata as strings); `None` for anything else, fractions included.
pub(super) fn integer(value: &Value) -> Option<i64> {
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

/// An object's string field, when it is one.
pub(super) fn text<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a str> {
    object.get(field).and_then(Value::as_str)
}

pub(super) fn payment_key(
    provider: &Provider,
    account: &str,
    payment: Option<&str>,
) -> Option<PaymentKey> {
    Some(PaymentKey {
        provider: provider.clone(),
        account_id: AccountId::parse(account).ok()?,
        payment_intent_id: PaymentIntentId::parse(payment?).ok()?,
    })
}

/// Validates the token parameters an event carries; the error lists every bad field.
pub(super) fn token_params(
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

    #[test]
    fn versions_fold_rank_over_time() {
        assert!(ranked_version(2, 0).unwrap() > ranked_version(1, RANK_FACTOR - 1).unwrap());
        for secs in [-1, RANK_FACTOR, i64::MAX] {
            assert_eq!(ranked_version(3, secs), None, "{secs}");
        }
    }
}
