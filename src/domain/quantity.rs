//! How many tokens a payment buys.

use serde_json::Value;

/// 1..=max_quantity tokens; always a JSON integer (never `4.5`, never `"4"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(u32);

impl Quantity {
    /// Parses a JSON value. Strings and fractions are refused rather than coerced: a
    /// payment system must not guess what `"4"` or `4.5` was meant to buy.
    pub fn from_json(value: &Value, max: u32) -> Result<Self, String> {
        let rule = || format!("must be an integer from 1 to {max}");
        match value {
            Value::Number(n) => match n.as_i64() {
                Some(n) => Self::from_i64(n, max),
                None => Err(rule()),
            },
            _ => Err(rule()),
        }
    }

    pub fn from_i64(n: i64, max: u32) -> Result<Self, String> {
        if (1..=i64::from(max)).contains(&n) {
            Ok(Self(n as u32))
        } else {
            Err(format!("must be an integer from 1 to {max}"))
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_integers_in_range() {
        assert_eq!(Quantity::from_json(&json!(4), 1000).unwrap().get(), 4);
        assert_eq!(Quantity::from_json(&json!(1000), 1000).unwrap().get(), 1000);
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            json!(0),
            json!(-1),
            json!(4.5),
            json!("4"),
            json!(1001),
            json!(null),
            json!(4.0),
        ] {
            assert!(Quantity::from_json(&bad, 1000).is_err(), "{bad}");
        }
    }
}
