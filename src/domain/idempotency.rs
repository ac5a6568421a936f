//! The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header):
//! 1–255 visible ASCII characters. It is only ever stored as a value, never as a field
//! name, so its alphabet may hold `$` and `.`.

use std::fmt;

/// A client's idempotency key, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted.
    pub const MAX_LEN: usize = 255;
    /// The rule, as told to clients in a 422 answer.
    pub const RULE: &'static str = "must be 1 to 255 visible ASCII characters";

    pub fn parse(value: &str) -> Result<Self, String> {
        let visible = value.bytes().all(|b| b.is_ascii_graphic());
        if visible && (1..=Self::MAX_LEN).contains(&value.len()) {
            Ok(Self(value.to_owned()))
        } else {
            Err(Self::RULE.to_owned())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_visible_ascii_up_to_255() {
        for good in [
            "a",
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            "\"quoted\"",
            &"k".repeat(255),
        ] {
            assert!(IdempotencyKey::parse(good).is_ok(), "{good}");
        }
        for bad in ["", " ", "a b", "tab\t", "é", &"k".repeat(256)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
    }
}
