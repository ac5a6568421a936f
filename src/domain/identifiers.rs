//! String identifiers with a fixed alphabet. The alphabets exclude `$` and `.`, which is
//! what keeps them from ever being read by MongoDB as operators or field paths.

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

/// What an identifier that names a resource in a URL path is told when it is `.` or
/// `..`: a client resolving the URL it is given (`Location`) reads those as the
/// directory itself or its parent, and would ask for another resource.
pub const DOT_SEGMENT_RULE: &str = "must not be `.` or `..`, which a URL path reads as a directory";

/// Declares a string newtype whose only constructor checks it against `$pattern`; with
/// `path_segment`, also that it is not a dot segment (`DOT_SEGMENT_RULE`).
macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $pattern:literal) => {
        identifier!($(#[$doc])* $name, $pattern, false);
    };
    ($(#[$doc:meta])* $name:ident, $pattern:literal, path_segment) => {
        identifier!($(#[$doc])* $name, $pattern, true);
    };
    ($(#[$doc:meta])* $name:ident, $pattern:literal, $path_segment:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The alphabet, as a regular expression; also what the OpenAPI document
            /// gives as the field's `pattern`.
            pub const PATTERN: &'static str = $pattern;
            /// The rule, as told to clients in a 422 answer.
            pub const RULE: &'static str = concat!("must match ", $pattern);

            pub fn parse(value: &str) -> Result<Self, String> {
                static PATTERN: LazyLock<Regex> =
                    LazyLock::new(|| Regex::new($pattern).expect("valid identifier pattern"));
                if !PATTERN.is_match(value) {
                    Err(Self::RULE.to_owned())
                } else if $path_segment && matches!(value, "." | "..") {
                    Err(DOT_SEGMENT_RULE.to_owned())
                } else {
                    Ok(Self(value.to_owned()))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

identifier!(
    /// A payment provider's configured name, e.g. `stripe`.
    Provider,
    r"^[a-z][a-z0-9_-]{0,31}$"
);
identifier!(
    /// The merchant account at the provider; `default` when the provider has one account.
    AccountId,
    r"^[A-Za-z0-9_.:-]{1,64}$",
    path_segment
);
identifier!(
    /// The provider's id of the payment, e.g. `pi_123`.
    PaymentIntentId,
    r"^[A-Za-z0-9_.:-]{1,128}$",
    path_segment
);
identifier!(
    /// The kind of token issued, e.g. `standard`.
    TokenType,
    r"^[a-z0-9][a-z0-9_.-]{0,63}$"
);
identifier!(
    /// The client's reference of a redemption by amount (an order id, a session id): the
    /// redemption's idempotency key, unique per owner. The payment id alphabet, since it
    /// names the redemption in a URL path.
    RedemptionReference,
    r"^[A-Za-z0-9_.:-]{1,128}$",
    path_segment
);

/// An ObjectId as clients write it (owners, token ids, cursors): 24 hex characters,
/// exactly what `ObjectId::parse_str` accepts.
pub const OBJECT_ID_PATTERN: &str = r"^[0-9a-fA-F]{24}$";

/// A configured provider's name (`[providers.NAME]`) is a `Provider` from the start; a
/// name outside the alphabet is refused as an invalid value, naming the key, not quoting it.
impl<'de> serde::Deserialize<'de> for Provider {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::parse(&name).map_err(|_| {
            serde::de::Error::invalid_value(
                serde::de::Unexpected::Other("a name outside the alphabet"),
                &format!("a provider name matching {}", Self::PATTERN).as_str(),
            )
        })
    }
}

/// A configured account (`providers.<name>.accounts`) is an `AccountId` from the start;
/// one outside the alphabet is refused with the rule, quoting nothing of it.
impl<'de> serde::Deserialize<'de> for AccountId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let account = String::deserialize(deserializer)?;
        Self::parse(&account).map_err(serde::de::Error::custom)
    }
}

/// Configured providers are looked up by the name a request path carries.
impl std::borrow::Borrow<str> for Provider {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Default for AccountId {
    fn default() -> Self {
        Self("default".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_rules() {
        assert!(Provider::parse("stripe").is_ok());
        assert!(Provider::parse("standard-webhooks").is_ok());
        for bad in ["", "Stripe", "1abc", "a.b", "$where", &"a".repeat(33)] {
            assert!(Provider::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn operator_and_path_characters_are_rejected_everywhere() {
        for bad in ["{\"$gt\": \"\"}", "$where", "a b", "a/b", ""] {
            assert!(PaymentIntentId::parse(bad).is_err(), "{bad}");
            assert!(AccountId::parse(bad).is_err(), "{bad}");
            assert!(TokenType::parse(bad).is_err(), "{bad}");
        }
        assert!(
            TokenType::parse("a.b").is_ok(),
            "dots are fine inside a value"
        );
    }

    #[test]
    fn what_names_a_resource_in_a_url_path_is_no_dot_segment() {
        for dots in [".", ".."] {
            assert_eq!(AccountId::parse(dots), Err(DOT_SEGMENT_RULE.to_owned()));
            assert_eq!(
                PaymentIntentId::parse(dots),
                Err(DOT_SEGMENT_RULE.to_owned())
            );
            assert_eq!(
                RedemptionReference::parse(dots),
                Err(DOT_SEGMENT_RULE.to_owned())
            );
        }
        for fine in ["...", ".a", "a.", "order.1"] {
            assert!(PaymentIntentId::parse(fine).is_ok(), "{fine}");
            assert!(RedemptionReference::parse(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn length_limits() {
        assert!(PaymentIntentId::parse(&"p".repeat(128)).is_ok());
        assert!(PaymentIntentId::parse(&"p".repeat(129)).is_err());
        assert!(AccountId::parse(&"a".repeat(64)).is_ok());
        assert!(AccountId::parse(&"a".repeat(65)).is_err());
        assert!(TokenType::parse(&"t".repeat(64)).is_ok());
        assert!(TokenType::parse(&"t".repeat(65)).is_err());
    }
}
