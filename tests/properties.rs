//! Property tests (proptest) for the code that reads untrusted input before anything else
//! does: webhook signature verification, provider event parsing and the request
//! validators. Each property runs proptest's default 256 cases (`PROPTEST_CASES=10000
//! cargo test --test properties` for a longer search); a failure is shrunk to a minimal
//! input and printed.
//!
//! The JSON body parser (`http::extract::parse_json`, private to its module) has its
//! properties next to it, in `src/http/extract.rs`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use proptest::prelude::*;
use secrecy::SecretString;
use serde_json::{Value, json};

use tokenmint::domain::ParsedEvent;
use tokenmint::domain::{
    AccountId, Owner, PaymentIntentId, PaymentStatus, Provider, Quantity, TokenId, TokenStatus,
    TokenType,
};
use tokenmint::settings::WebhookScheme;
use tokenmint::webhooks::signature::{
    SignatureError, SignatureHeaders, check_secret, sign_standard, sign_stripe, verify_standard,
    verify_stripe,
};
use tokenmint::webhooks::{parse_standard, parse_stripe};

const TOLERANCE: u64 = 300;

fn secrets(values: &[&str]) -> Vec<SecretString> {
    values
        .iter()
        .map(|v| SecretString::from((*v).to_owned()))
        .collect()
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// A Stripe signing secret, as `Settings` accepts it (`whsec_` and at least 16
/// characters). HMAC pads short keys with zero bytes, so "k" and "k\0" are the same key:
/// that is HMAC, not a flaw of ours, and secrets here have no NUL to avoid it.
fn stripe_secret() -> impl Strategy<Value = String> {
    "whsec_[A-Za-z0-9]{16,40}"
}

/// A Standard Webhooks secret as `Settings` accepts it, `whsec_<base64 of a 24–64 byte
/// key>`, with no zero byte in the key (same reason as above).
fn standard_secret() -> impl Strategy<Value = String> {
    prop::collection::vec(1u8..=255, 24..=64)
        .prop_map(|key| format!("whsec_{}", BASE64.encode(key)))
}

/// Any unix time a sender might sign with, and an offset within the tolerance.
fn signed_at() -> impl Strategy<Value = (i64, i64)> {
    (-1_000_000_000_000i64..1_000_000_000_000, -300i64..=300)
}

/// An offset outside the tolerance, either way.
fn out_of_tolerance() -> impl Strategy<Value = i64> {
    prop_oneof![301i64..1_000_000_000, -1_000_000_000i64..-300]
}

fn stripe(header: &str, body: &[u8], keys: &[&str], now: i64) -> Result<(), SignatureError> {
    let headers = SignatureHeaders {
        stripe_signature: Some(header),
        ..Default::default()
    };
    verify_stripe(&headers, body, &secrets(keys), TOLERANCE, now)
}

fn standard(
    id: &str,
    timestamp: i64,
    signature: &str,
    body: &[u8],
    keys: &[&str],
    now: i64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp.to_string();
    let headers = SignatureHeaders {
        webhook_id: Some(id),
        webhook_timestamp: Some(&timestamp),
        webhook_signature: Some(signature),
        ..Default::default()
    };
    verify_standard(&headers, body, &secrets(keys), TOLERANCE, now)
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

/// Stripe-shaped events whose every field is drawn from valid, borderline and wrong values.
fn stripe_event() -> impl Strategy<Value = Value> {
    let event_type = prop_oneof![
        Just("payment_intent.processing"),
        Just("payment_intent.succeeded"),
        Just("payment_intent.payment_failed"),
        Just("payment_intent.canceled"),
        Just("charge.refunded"),
        Just("customer.created"),
    ];
    let metadata = prop::collection::btree_map(
        prop_oneof![
            Just("tokenmint_owner".to_owned()),
            Just("tokenmint_token_type".to_owned()),
            Just("tokenmint_quantity".to_owned()),
            ".{0,8}"
        ],
        field(prop_oneof![
            Just(json!("65f1a0c2b3d4e5f601234567")),
            Just(json!("standard")),
            "-?[0-9]{1,22}(\\.[0-9])?".prop_map(Value::from),
        ]),
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    let object = (
        field(identifier(130)),
        field(any::<bool>().prop_map(Value::from)),
        field(metadata),
        field(any::<i64>().prop_map(Value::from)),
    )
        .prop_map(|(id, refunded, metadata, created)| {
            json!({"id": id, "payment_intent": id, "refunded": refunded, "metadata": metadata,
                   "created": created, "amount": created, "currency": "eur"})
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

/// What every accepted identifier has in common: nothing MongoDB could read as an
/// operator, nothing invisible.
fn is_inert(value: &str) -> bool {
    !value.is_empty()
        && !value.contains('$')
        && !value.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_object_id_hex(value: &str) -> bool {
    value.len() == 24 && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Strings near an identifier's alphabet, so that acceptances are not all luck.
fn identifier_like() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[A-Za-z0-9_.:$ \t\n/{}-]{0,140}",
        "[a-z][a-z0-9_-]{0,40}\n?",
    ]
}

proptest! {
    // --- webhook signatures -------------------------------------------------------------

    #[test]
    fn stripe_verify_never_panics(
        header in any::<String>(),
        body in bytes(256),
        key in any::<String>(),
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let headers = SignatureHeaders { stripe_signature: Some(&header), ..Default::default() };
        let _ = verify_stripe(&headers, &body, &secrets(&[&key]), tolerance, now);
    }

    #[test]
    fn stripe_verify_never_panics_on_header_like_input(
        header in "(t=-?[0-9]{0,20}|v1=[0-9a-f]{0,66}|v0=[0-9a-f]{0,8}|[=, ]|.){0,8}",
        body in bytes(64),
        now in any::<i64>(),
    ) {
        let _ = stripe(&header, &body, &["whsec_0123456789abcdef"], now);
    }

    #[test]
    fn standard_verify_never_panics(
        id in prop::option::of(any::<String>()),
        timestamp in prop::option::of(prop_oneof![any::<String>(), any::<i64>().prop_map(|t| t.to_string())]),
        signature in prop::option::of(prop_oneof![any::<String>(), "(v1,[A-Za-z0-9+/=]{0,50}| |v2,.{0,4}){0,4}"]),
        body in bytes(256),
        key in prop_oneof![any::<String>(), standard_secret()],
        now in any::<i64>(),
        tolerance in any::<u64>(),
    ) {
        let headers = SignatureHeaders {
            webhook_id: id.as_deref(),
            webhook_timestamp: timestamp.as_deref(),
            webhook_signature: signature.as_deref(),
            ..Default::default()
        };
        let _ = verify_standard(&headers, &body, &secrets(&[&key]), tolerance, now);
    }

    #[test]
    fn stripe_signature_verifies_only_its_own_body_secret_and_time(
        secret in stripe_secret(),
        other_secret in stripe_secret(),
        body in bytes(512),
        other_body in bytes(512),
        (timestamp, skew) in signed_at(),
        late in out_of_tolerance(),
    ) {
        let header = sign_stripe(&secret, timestamp, &body);
        prop_assert_eq!(stripe(&header, &body, &[&secret], timestamp + skew), Ok(()));
        // Among rotated secrets, in any position.
        prop_assert_eq!(stripe(&header, &body, &[&other_secret, &secret], timestamp + skew), Ok(()));
        if other_body != body {
            prop_assert_eq!(
                stripe(&header, &other_body, &[&secret], timestamp + skew),
                Err(SignatureError::Invalid)
            );
        }
        if other_secret != secret {
            prop_assert_eq!(
                stripe(&header, &body, &[&other_secret], timestamp + skew),
                Err(SignatureError::Invalid)
            );
        }
        prop_assert_eq!(
            stripe(&header, &body, &[&secret], timestamp + late),
            Err(SignatureError::OutOfTolerance)
        );
    }

    #[test]
    fn standard_signature_verifies_only_its_own_body_secret_id_and_time(
        secret in standard_secret(),
        other_secret in standard_secret(),
        id in "[A-Za-z0-9_-]{1,40}",
        other_id in "[A-Za-z0-9_-]{1,40}",
        body in bytes(512),
        other_body in bytes(512),
        (timestamp, skew) in signed_at(),
        late in out_of_tolerance(),
    ) {
        let signature = sign_standard(&secret, &id, timestamp, &body);
        let now = timestamp + skew;
        prop_assert_eq!(standard(&id, timestamp, &signature, &body, &[&secret], now), Ok(()));
        let with_others = format!("v1,AAAA {signature} v2,xyz");
        prop_assert_eq!(
            standard(&id, timestamp, &with_others, &body, &[&other_secret, &secret], now),
            Ok(())
        );
        if other_body != body {
            prop_assert_eq!(
                standard(&id, timestamp, &signature, &other_body, &[&secret], now),
                Err(SignatureError::Invalid)
            );
        }
        if other_secret != secret {
            prop_assert_eq!(
                standard(&id, timestamp, &signature, &body, &[&other_secret], now),
                Err(SignatureError::Invalid)
            );
        }
        if other_id != id {
            prop_assert_eq!(
                standard(&other_id, timestamp, &signature, &body, &[&secret], now),
                Err(SignatureError::Invalid)
            );
        }
        prop_assert_eq!(
            standard(&id, timestamp, &signature, &body, &[&secret], timestamp + late),
            Err(SignatureError::OutOfTolerance)
        );
    }

    // --- provider events ----------------------------------------------------------------

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
            prop_assert!(is_inert(parsed.key.account_id.as_str()));
            prop_assert!(is_inert(parsed.key.payment_intent_id.as_str()));
            // The version orders by status rank first: `created` never outranks a status.
            let created = event["created"].as_i64().unwrap();
            prop_assert!((0..10_000_000_000).contains(&created));
            prop_assert_eq!(parsed.version, parsed.status.rank() * 10_000_000_000 + created);
            if let Some(Ok(params)) = &parsed.token_params {
                prop_assert!((1..=max).contains(&params.quantity.get()));
            }
        }
    }

    #[test]
    fn standard_events_parse_to_valid_keys(event in standard_event(), max in 1u32..=1000) {
        let provider = Provider::parse("acme").unwrap();
        let body = serde_json::to_vec(&event).unwrap();
        if let Ok(ParsedEvent::Payment(parsed)) = parse_standard(&provider, "msg_1", &body, max) {
            prop_assert!(is_inert(parsed.key.account_id.as_str()));
            prop_assert!(is_inert(parsed.key.payment_intent_id.as_str()));
            prop_assert_eq!(Some(parsed.version), event["data"]["version"].as_i64());
            if let Some(Ok(params)) = &parsed.token_params {
                prop_assert!((1..=max).contains(&params.quantity.get()));
            }
        }
    }

    // --- request validators -------------------------------------------------------------

    #[test]
    fn identifiers_accept_only_inert_values_and_round_trip(value in identifier_like()) {
        if let Ok(v) = Provider::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 32 && value.starts_with(|c: char| c.is_ascii_lowercase()));
        }
        if let Ok(v) = AccountId::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 64);
        }
        if let Ok(v) = PaymentIntentId::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 128);
        }
        if let Ok(v) = TokenType::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 64 && !value.starts_with(['.', '_', '-']));
        }
        if let Ok(v) = TokenStatus::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
        }
    }

    #[test]
    fn identifiers_accept_their_whole_documented_alphabet(
        provider in "[a-z][a-z0-9_-]{0,31}",
        account in "[A-Za-z0-9_.:-]{1,64}",
        payment in "[A-Za-z0-9_.:-]{1,128}",
        token_type in "[a-z0-9][a-z0-9_.-]{0,63}",
    ) {
        prop_assert_eq!(Provider::parse(&provider).map(|v| v.as_str().to_owned()), Ok(provider.clone()));
        prop_assert_eq!(AccountId::parse(&account).map(|v| v.as_str().to_owned()), Ok(account.clone()));
        prop_assert_eq!(PaymentIntentId::parse(&payment).map(|v| v.as_str().to_owned()), Ok(payment.clone()));
        prop_assert_eq!(TokenType::parse(&token_type).map(|v| v.as_str().to_owned()), Ok(token_type.clone()));
    }

    #[test]
    fn object_ids_are_exactly_24_hex_digits(
        value in prop_oneof![any::<String>(), "[0-9a-fA-FxX $\n]{22,26}", "[0-9a-fA-F]{24}"],
    ) {
        let owner = Owner::parse(&value);
        let token = TokenId::parse(&value);
        prop_assert_eq!(owner.is_ok(), is_object_id_hex(&value));
        prop_assert_eq!(token.is_ok(), is_object_id_hex(&value));
        if let (Ok(owner), Ok(token)) = (owner, token) {
            prop_assert_eq!(owner.to_string(), value.to_ascii_lowercase());
            prop_assert_eq!(token.to_string(), value.to_ascii_lowercase());
        }
    }

    #[test]
    fn quantities_are_accepted_iff_integer_in_range(value in json_value(), max in 1u32..=100_000) {
        let accepted = Quantity::from_json(&value, max);
        let expected = value.as_i64().filter(|n| (1..=i64::from(max)).contains(n));
        prop_assert_eq!(accepted.as_ref().ok().map(|q| i64::from(q.get())), expected);
    }

    #[test]
    fn quantity_numbers_near_the_bounds(n in -3i64..=1003, fraction in prop::bool::ANY) {
        let value = if fraction { json!(n as f64 + 0.5) } else { json!(n) };
        let accepted = Quantity::from_json(&value, 1000).is_ok();
        prop_assert_eq!(accepted, !fraction && (1..=1000).contains(&n));
        // A whole number written as a float is refused too: `4.0` is not `4`.
        prop_assert!(Quantity::from_json(&json!(n as f64), 1000).is_err());
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

proptest! {
    // --- configured secrets -------------------------------------------------------------

    #[test]
    fn generated_secrets_are_ones_settings_accept(
        stripe in stripe_secret(),
        standard in standard_secret(),
    ) {
        prop_assert_eq!(check_secret(WebhookScheme::Stripe, &stripe), Ok(()));
        prop_assert_eq!(check_secret(WebhookScheme::StandardWebhooks, &standard), Ok(()));
    }

    #[test]
    fn secret_check_never_panics_nor_quotes_the_secret(
        secret in prop_oneof![any::<String>(), "whsec_[A-Za-z0-9+/=]{0,100}", "whsec_.{0,30}"],
    ) {
        for scheme in [WebhookScheme::Stripe, WebhookScheme::StandardWebhooks] {
            if let Err(problem) = check_secret(scheme, &secret) {
                prop_assert!(secret.len() < 12 || !problem.contains(secret.as_str()), "{}", problem);
            }
        }
    }
}
