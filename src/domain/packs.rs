//! What a provider's own prices sell, in tokens (`providers.<name>.token_packs`, Paddle):
//! the items of a transaction, read through them, say how many tokens of each type it
//! bought. `issuance.token_prices` checks a payment's whole amount, which cannot tell a
//! token pack from anything else the same transaction pays for: a subscription's
//! renewal (Paddle copies the checkout's `custom_data` onto it), or another product in
//! the same cart. Items can: the customer's browser may write `custom_data`, but not
//! which of the merchant's prices a transaction charged, nor how many of each.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::{IssuanceParams, TokenType};

/// How many tokens of which type one unit of a price sells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPack {
    pub token_type: TokenType,
    pub quantity: u32,
}

/// One item of a transaction, as the provider reports it.
#[derive(Debug, Clone, Copy)]
pub struct PaidItem<'a> {
    /// The provider's id of the price charged.
    pub price: &'a str,
    /// How many units of it; negative for units taken back (Paddle reports an item
    /// credited that way).
    pub units: i64,
    /// Charged for part of a period (a plan changed mid-cycle).
    pub prorated: bool,
}

/// A pack as the configuration writes it (`token_type = "…"`, `quantity = N`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenPack {
    token_type: String,
    quantity: u32,
}

/// A provider's token packs, by the provider's price id. Empty: the provider's items
/// are not read, and only the prices hold its metadata to what was paid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenPacks(BTreeMap<String, TokenPack>);

impl TokenPacks {
    /// Packs from the configuration's shape (price id → pack); `Err` names the entry at
    /// fault and why. A price id is Paddle's: `pri_` and letters or digits.
    fn parse(raw: BTreeMap<String, RawTokenPack>) -> Result<Self, String> {
        let mut packs = BTreeMap::new();
        for (price, pack) in raw {
            let id = price.strip_prefix("pri_").unwrap_or_default();
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(format!(
                    "`{price}`: a price id is Paddle's, `pri_` followed by letters and digits"
                ));
            }
            let token_type = TokenType::parse(&pack.token_type)
                .map_err(|rule| format!("`{price}.token_type`: {rule}"))?;
            if pack.quantity == 0 {
                return Err(format!("`{price}.quantity`: a pack sells at least 1 token"));
            }
            let quantity = pack.quantity;
            packs.insert(
                price,
                TokenPack {
                    token_type,
                    quantity,
                },
            );
        }
        Ok(Self(packs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tokens that `items` buy, by type: what the packs' units sell, net of what the
    /// units taken back (a negative quantity, of any pack of the type, prorated or not)
    /// sold. What else they charge is kept, for `TokensBought::short_of` to refuse: a
    /// price that is no pack, and a prorated unit of one (it pays for part of a period;
    /// a pack sells whole ones, which the next renewal buys).
    pub fn bought<'a>(&self, items: impl IntoIterator<Item = PaidItem<'a>>) -> TokensBought {
        let mut net = BTreeMap::<&TokenType, i128>::new();
        let mut unsold = BTreeSet::new();
        for item in items {
            let pack = self.0.get(item.price);
            let (Some(pack), false) = (pack, item.prorated && item.units > 0) else {
                unsold.insert(item.price.to_owned());
                continue;
            };
            let tokens = net.entry(&pack.token_type).or_default();
            *tokens = tokens.saturating_add(i128::from(item.units) * i128::from(pack.quantity));
        }
        let tokens = net
            .into_iter()
            .map(|(token_type, tokens)| {
                let tokens = u64::try_from(tokens.max(0)).unwrap_or(u64::MAX);
                (token_type.clone(), tokens)
            })
            .collect();
        TokensBought { tokens, unsold }
    }

    /// The token types the packs sell.
    pub fn token_types(&self) -> impl Iterator<Item = &TokenType> {
        self.0.values().map(|pack| &pack.token_type)
    }
}

/// Read straight into its final type from the configuration, refused with the reason.
impl<'de> Deserialize<'de> for TokenPacks {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::parse(BTreeMap::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// What a payment's items bought ([`TokenPacks::bought`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokensBought {
    /// The tokens, by type (a type whose packs were all taken back: 0).
    tokens: BTreeMap<TokenType, u64>,
    /// The prices charged that buy no whole pack (no pack, or a prorated unit of one).
    unsold: BTreeSet<String>,
}

impl TokensBought {
    /// Why the items do not buy the tokens `params` names; `None` when they buy as many
    /// or more (a customer may name fewer than bought: theirs to lose).
    ///
    /// They buy none unless all they charge is packs of that type. A refund takes back
    /// its share of the payment's whole amount: in a transaction that also charged
    /// something else (a plan, another product, packs of another type), a refund of the
    /// packs alone would take back only their share of the total, and leave the rest of
    /// the tokens active.
    pub fn short_of(&self, params: &IssuanceParams) -> Option<String> {
        let token_type = &params.token_type;
        if let Some(price) = self.unsold.first() {
            return Some(format!(
                "the payment also charges {price}, which buys no whole token pack: refunds are shares of its whole amount, so only a payment of whole token packs alone issues"
            ));
        }
        if let Some(other) = self.tokens.keys().find(|other| *other != token_type) {
            return Some(format!(
                "the payment also charges packs of type {other}: refunds are shares of its whole amount, so only a payment of packs of type {token_type} alone issues them"
            ));
        }
        let bought = self.tokens.get(token_type).copied().unwrap_or(0);
        let named = u64::from(params.quantity.get());
        (bought < named).then(|| {
            format!(
                "the payment's items buy {bought} tokens of type {token_type}; its metadata names {named}"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Owner, Quantity};

    fn packs(entries: &[(&str, &str, u32)]) -> Result<TokenPacks, String> {
        let raw = entries
            .iter()
            .map(|(price, token_type, quantity)| {
                let pack = RawTokenPack {
                    token_type: (*token_type).to_owned(),
                    quantity: *quantity,
                };
                ((*price).to_owned(), pack)
            })
            .collect();
        TokenPacks::parse(raw)
    }

    fn params(token_type: &str, quantity: u32) -> IssuanceParams {
        IssuanceParams {
            owner: Owner::parse("65f1a0c2b3d4e5f601234567").unwrap(),
            token_type: TokenType::parse(token_type).unwrap(),
            quantity: Quantity::from_i64(i64::from(quantity), 1000).unwrap(),
        }
    }

    /// `packs` and one more.
    fn packs_with(
        packs: &TokenPacks,
        (price, token_type, quantity): (&str, &str, u32),
    ) -> TokenPacks {
        let mut more = packs.clone();
        let token_type = TokenType::parse(token_type).unwrap();
        more.0.insert(
            price.to_owned(),
            TokenPack {
                token_type,
                quantity,
            },
        );
        more
    }

    /// Items of `(price, units)`, none prorated.
    fn items<'a>(items: &[(&'a str, i64)]) -> Vec<PaidItem<'a>> {
        items
            .iter()
            .map(|&(price, units)| PaidItem {
                price,
                units,
                prorated: false,
            })
            .collect()
    }

    #[test]
    fn items_buy_what_their_packs_sell_and_nothing_else() {
        let packs = packs(&[("pri_ten", "credit", 10), ("pri_vip", "pass", 1)]).unwrap();
        let bought = packs.bought(items(&[("pri_ten", 2), ("pri_ten", 1)]));
        assert_eq!(bought.short_of(&params("credit", 30)), None);
        assert_eq!(bought.short_of(&params("credit", 3)), None, "fewer is fine");
        let short = bought.short_of(&params("credit", 31)).unwrap();
        assert!(short.contains("buy 30") && short.contains("31"), "{short}");
        assert!(bought.short_of(&params("pass", 1)).is_some());
        // Only a payment of packs of the type named alone buys: refunds are shares of
        // its whole amount.
        let plan = packs.bought(items(&[("pri_ten", 2), ("pri_plan", 1)]));
        let short = plan.short_of(&params("credit", 1)).unwrap();
        assert!(short.contains("pri_plan"), "{short}");
        let two_types = packs.bought(items(&[("pri_ten", 2), ("pri_vip", 1)]));
        for token_type in ["credit", "pass"] {
            assert!(
                two_types.short_of(&params(token_type, 1)).is_some(),
                "{token_type}"
            );
        }
        // Units taken back count against what the type's packs sold, and never below
        // none; huge ones do not wrap.
        let packs = packs_with(&packs, ("pri_five", "credit", 5));
        let net = packs.bought(items(&[("pri_ten", 3), ("pri_five", -2)]));
        assert_eq!(net.short_of(&params("credit", 20)), None);
        assert!(net.short_of(&params("credit", 21)).is_some());
        let none_left = packs.bought(items(&[("pri_ten", 0), ("pri_ten", -3)]));
        assert!(none_left.short_of(&params("credit", 1)).is_some());
        let huge = packs.bought(items(&[("pri_vip", i64::MAX), ("pri_vip", i64::MAX)]));
        assert_eq!(huge.short_of(&params("pass", 1000)), None);
        let none = TokenPacks::default().bought(items(&[("pri_ten", 1)]));
        assert!(none.short_of(&params("credit", 1)).is_some());
        // A prorated unit buys no whole pack, and its payment none; one taken back still
        // counts against the rest.
        let mut prorated = items(&[("pri_ten", 1), ("pri_ten", 2)]);
        prorated[0].prorated = true;
        let short = packs
            .bought(prorated)
            .short_of(&params("credit", 1))
            .unwrap();
        assert!(short.contains("pri_ten"), "{short}");
        let mut credited = items(&[("pri_ten", 2), ("pri_ten", -1)]);
        credited[1].prorated = true;
        let bought = packs.bought(credited);
        assert_eq!(bought.short_of(&params("credit", 10)), None);
        assert!(bought.short_of(&params("credit", 11)).is_some());
    }

    #[test]
    fn a_pack_list_names_price_ids_and_quantities_that_can_be() {
        for (bad, names) in [
            (packs(&[("price_ten", "credit", 10)]), "price_ten"),
            (packs(&[("pri_", "credit", 10)]), "pri_"),
            (packs(&[("pri_t en", "credit", 10)]), "pri_t en"),
            (packs(&[("pri_ten", "credit", 0)]), "at least 1"),
            (packs(&[("pri_ten", "Credit", 1)]), "pri_ten.token_type"),
        ] {
            let err = bad.unwrap_err();
            assert!(err.contains(names), "{err}");
        }
    }
}
