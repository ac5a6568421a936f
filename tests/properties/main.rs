//! Property tests (proptest) for the code that reads untrusted input before anything else
//! does: webhook signature verification, provider event parsing and the request
//! validators. Each property runs proptest's default 256 cases (`PROPTEST_CASES=10000
//! cargo test --test properties` for a longer search); a failure is shrunk to a minimal
//! input and printed.
//!
//! One module per concern: the configured [`secrets`], the Stripe and Standard Webhooks
//! [`signatures`] and [`events`], one module for each of [`paddle`] and [`adyen`]
//! (signatures and events), and the request [`validators`]. The strategies they share are
//! here. The JSON body parser (`http::extract::parse_json`, private to its module) has its
//! properties next to it, in `src/http/extract.rs`.

mod adyen;
mod events;
mod paddle;
mod secrets;
mod signatures;
mod validators;

use proptest::prelude::*;
use secrecy::SecretString;
use serde_json::{Value, json};

use tokenmint::domain::PaymentEvent;
use tokenmint::settings::WebhookScheme;
use tokenmint::webhooks::signature::{self, SignatureError, SignatureHeaders, Verification};

/// The timestamp tolerance every signature check here runs with, in seconds.
const TOLERANCE: u64 = 300;

/// Configured secrets, as `Settings` hands them over.
fn secrets(values: &[&str]) -> Vec<SecretString> {
    values
        .iter()
        .map(|v| SecretString::from((*v).to_owned()))
        .collect()
}

/// Verifies a delivery of `scheme` with `headers` under `keys`, within `tolerance_secs`
/// of `now`, as a configured provider does.
fn verify(
    scheme: WebhookScheme,
    headers: &SignatureHeaders<'_>,
    body: &[u8],
    keys: &[&str],
    tolerance_secs: u64,
    now: i64,
) -> Result<(), SignatureError> {
    let secrets = secrets(keys);
    let check = Verification {
        secrets: &secrets,
        tolerance_secs,
        now,
    };
    signature::verify(scheme, headers, body, &check)
}

/// Any bytes, fewer than `max`.
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Any unix time a sender might sign with, and an offset within the tolerance.
fn signed_at() -> impl Strategy<Value = (i64, i64)> {
    (-1_000_000_000_000i64..1_000_000_000_000, -300i64..=300)
}

/// An offset outside the tolerance, either way.
fn out_of_tolerance() -> impl Strategy<Value = i64> {
    prop_oneof![301i64..1_000_000_000, -1_000_000_000i64..-300]
}

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value that is sometimes what the field should hold and sometimes anything at all.
fn field(good: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Value> {
    prop_oneof![3 => good, 1 => json_value()]
}

/// An account or payment id: mostly valid, sometimes with `$`, spaces or too long.
fn identifier(max: usize) -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => "[A-Za-z0-9_.:-]{1,40}".prop_map(Value::from),
        1 => proptest::string::string_regex(&format!("[A-Za-z0-9_.:$ -]{{0,{max}}}"))
            .expect("valid regex")
            .prop_map(Value::from),
    ]
}

/// A provider's metadata object, mostly with tokenmint's keys (`{prefix}tokenmint_owner`,
/// `…_token_type`, `…_quantity`) holding valid, borderline or wrong values.
fn tokenmint_metadata(prefix: &'static str) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop_oneof![
            Just(format!("{prefix}tokenmint_owner")),
            Just(format!("{prefix}tokenmint_token_type")),
            Just(format!("{prefix}tokenmint_quantity")),
            ".{0,8}"
        ],
        field(prop_oneof![
            Just(json!("65f1a0c2b3d4e5f601234567")),
            Just(json!("standard")),
            "-?[0-9]{1,22}(\\.[0-9])?".prop_map(Value::from),
        ]),
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// What every parser promises of a payment event it returns, whatever the body held: a
/// key nothing can read as an operator and a quantity within `max`.
fn check_payment_event(parsed: &PaymentEvent, max: u32) -> Result<(), TestCaseError> {
    prop_assert!(is_inert(parsed.key.account_id.as_str()));
    prop_assert!(is_inert(parsed.key.payment_intent_id.as_str()));
    if let Some(Ok(params)) = &parsed.token_params {
        prop_assert!((1..=max).contains(&params.quantity.get()));
    }
    Ok(())
}

/// What every accepted identifier has in common: nothing MongoDB could read as an
/// operator, nothing invisible.
fn is_inert(value: &str) -> bool {
    !value.is_empty()
        && !value.contains('$')
        && !value.chars().any(|c| c.is_whitespace() || c.is_control())
}
