//! The request validators: identifiers accept exactly their documented alphabet and
//! nothing MongoDB could read as an operator, object ids are 24 hex digits, quantities are
//! whole numbers in range.

use proptest::prelude::*;
use serde_json::json;

use tokenmint::domain::{
    AccountId, DOT_SEGMENT_RULE, Owner, PaymentIntentId, Provider, Quantity, TokenId, TokenStatus,
    TokenType,
};

use crate::{is_inert, json_value};

/// Exactly 24 hex digits, any case.
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
    #[test]
    fn identifiers_accept_only_inert_values_and_round_trip(value in identifier_like()) {
        if let Ok(v) = Provider::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 32 && value.starts_with(|c: char| c.is_ascii_lowercase()));
        }
        let dot_segment = matches!(value.as_str(), "." | "..");
        if let Ok(v) = AccountId::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 64 && !dot_segment);
        }
        if let Ok(v) = PaymentIntentId::parse(&value) {
            prop_assert_eq!(v.as_str(), value.as_str());
            prop_assert!(is_inert(&value) && value.len() <= 128 && !dot_segment);
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
        // But for `.` and `..`, which name no resource in a URL path.
        let named = |value: &String| if matches!(value.as_str(), "." | "..") {
            Err(DOT_SEGMENT_RULE.to_owned())
        } else {
            Ok(value.clone())
        };
        prop_assert_eq!(AccountId::parse(&account).map(|v| v.as_str().to_owned()), named(&account));
        prop_assert_eq!(PaymentIntentId::parse(&payment).map(|v| v.as_str().to_owned()), named(&payment));
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
