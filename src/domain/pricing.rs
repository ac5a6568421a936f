//! What a token costs, where the operator says so (`issuance.token_prices`): the least a
//! provider event's amount must be for the tokens its metadata names. Without it the
//! metadata alone decides the quantity, which is sound only where the merchant's backend
//! writes it (Stripe's PaymentIntent metadata): Paddle's `custom_data` is also written
//! by Paddle.js in the customer's browser, so a customer could pay the cheapest price
//! and name any quantity, or any token type: metadata the customer may have written
//! names only priced types.

use std::collections::BTreeMap;

use super::{IssuanceParams, TokenType};

/// Prices per token type, each in minor units per token by currency (ISO 4217 code,
/// upper case). A type without prices is not priced: its metadata is taken as named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenPrices(BTreeMap<TokenType, BTreeMap<String, u64>>);

impl TokenPrices {
    /// Prices from the configuration's shape (token type → currency → minor units per
    /// token); `Err` names the entry at fault and why.
    pub fn parse(raw: &BTreeMap<String, BTreeMap<String, u64>>) -> Result<Self, String> {
        let mut prices = BTreeMap::new();
        for (token_type, by_currency) in raw {
            let parsed = TokenType::parse(token_type)
                .map_err(|rule| format!("token type `{token_type}`: {rule}"))?;
            if by_currency.is_empty() {
                return Err(format!("`{token_type}` names no currency"));
            }
            let mut per_currency = BTreeMap::new();
            for (currency, price) in by_currency {
                if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(format!(
                        "`{token_type}.{currency}`: a currency is a three-letter ISO 4217 code"
                    ));
                }
                if *price == 0 {
                    return Err(format!(
                        "`{token_type}.{currency}`: a price is at least 1 minor unit"
                    ));
                }
                per_currency.insert(currency.to_ascii_uppercase(), *price);
            }
            prices.insert(parsed, per_currency);
        }
        Ok(Self(prices))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether tokens of `token_type` have a price.
    pub fn has_price(&self, token_type: &TokenType) -> bool {
        self.0.contains_key(token_type)
    }

    /// Why a payment of `amount` minor units of `currency` does not pay for `params`;
    /// `None` when it does, or when their token type has no price and the merchant named
    /// it. A priced type is refused when the event names no amount, or a currency it has
    /// no price in: what cannot be checked is not taken on trust. So is an unpriced type
    /// the customer may have named (`customer_named`), wherever any price is configured
    /// (always in production with such a provider): else a checkout for the cheapest
    /// item, or a free one, could name any type the merchant issues elsewhere.
    pub fn unpaid(
        &self,
        params: &IssuanceParams,
        amount: Option<i64>,
        currency: Option<&str>,
        customer_named: bool,
    ) -> Option<String> {
        let token_type = &params.token_type;
        let Some(by_currency) = self.0.get(token_type) else {
            return (customer_named && !self.is_empty()).then(|| {
                format!(
                    "tokens of type {token_type} have no price, and the payment's metadata may be the customer's"
                )
            });
        };
        let Some(currency) = currency.map(str::to_ascii_uppercase) else {
            return Some(format!(
                "tokens of type {token_type} are priced, and the payment names no currency"
            ));
        };
        let Some(price) = by_currency.get(&currency) else {
            return Some(format!(
                "tokens of type {token_type} have no price in {currency}"
            ));
        };
        let quantity = u64::from(params.quantity.get());
        let cost = quantity.saturating_mul(*price);
        match amount {
            None => Some(format!(
                "tokens of type {token_type} are priced, and the payment names no amount"
            )),
            Some(paid) if u64::try_from(paid).map_or(true, |paid| paid < cost) => Some(format!(
                "{quantity} tokens of type {token_type} cost {cost} {currency} in minor units; the payment is {paid}"
            )),
            Some(_) => None,
        }
    }
}

/// Read straight into its final type from the configuration, refused with the reason.
impl<'de> serde::Deserialize<'de> for TokenPrices {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, BTreeMap<String, u64>>::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Owner, Quantity};

    fn prices(toml: &[(&str, &[(&str, u64)])]) -> Result<TokenPrices, String> {
        let raw = toml
            .iter()
            .map(|(token_type, by_currency)| {
                let by_currency = by_currency
                    .iter()
                    .map(|(currency, price)| ((*currency).to_owned(), *price))
                    .collect();
                ((*token_type).to_owned(), by_currency)
            })
            .collect();
        TokenPrices::parse(&raw)
    }

    fn params(token_type: &str, quantity: u32) -> IssuanceParams {
        IssuanceParams {
            owner: Owner::parse("65f1a0c2b3d4e5f601234567").unwrap(),
            token_type: TokenType::parse(token_type).unwrap(),
            quantity: Quantity::from_i64(i64::from(quantity), 1000).unwrap(),
        }
    }

    #[test]
    fn a_payment_pays_for_what_its_amount_covers_and_no_more() {
        let prices = prices(&[("credit", &[("EUR", 100), ("usd", 110)])]).unwrap();
        let ten = params("credit", 10);
        assert_eq!(prices.unpaid(&ten, Some(1000), Some("EUR"), false), None);
        assert_eq!(
            prices.unpaid(&ten, Some(1000), Some("eur"), false),
            None,
            "any case"
        );
        assert_eq!(
            prices.unpaid(&ten, Some(5000), Some("EUR"), false),
            None,
            "more is fine"
        );
        let short = prices.unpaid(&ten, Some(999), Some("EUR"), false).unwrap();
        assert!(
            short.contains("cost 1000 EUR") && short.contains("999"),
            "{short}"
        );
        assert!(
            prices
                .unpaid(&ten, Some(1099), Some("USD"), false)
                .is_some()
        );
        assert!(prices.unpaid(&ten, Some(-1), Some("EUR"), false).is_some());
        // What cannot be checked is refused.
        assert!(prices.unpaid(&ten, None, Some("EUR"), false).is_some());
        assert!(prices.unpaid(&ten, Some(1000), None, false).is_some());
        assert!(
            prices
                .unpaid(&ten, Some(1000), Some("GBP"), false)
                .is_some()
        );
        // A type without prices is taken as named by the merchant, not by the customer
        // where any price is configured; with none configured, as named.
        let unpriced = params("standard", 10);
        assert_eq!(prices.unpaid(&unpriced, Some(1), None, false), None);
        let refused = prices.unpaid(&unpriced, Some(1), None, true).unwrap();
        assert!(refused.contains("standard"), "{refused}");
        let none = TokenPrices::default();
        assert_eq!(none.unpaid(&unpriced, Some(1), None, true), None);
    }

    #[test]
    fn a_price_list_names_types_currencies_and_prices_that_can_be() {
        for (bad, names) in [
            (prices(&[("Credit", &[("EUR", 1)])]), "Credit"),
            (prices(&[("credit", &[("EURO", 1)])]), "EURO"),
            (prices(&[("credit", &[("EUR", 0)])]), "at least 1"),
            (prices(&[("credit", &[])]), "no currency"),
        ] {
            let err = bad.unwrap_err();
            assert!(err.contains(names), "{err}");
        }
    }
}
