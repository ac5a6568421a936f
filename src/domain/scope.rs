//! The permissions an API key can hold, and the accounts it may be limited to. Each is
//! parsed here, once, from configuration (`Deserialize`) and from the command line
//! (`FromStr`) alike.

use std::str::FromStr;

use serde::de::{Deserialize, Deserializer, Error as _};

use super::{AccountId, Provider};

/// A permission an API key may hold. `admin` grants every other one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    IssuancesWrite,
    IssuancesRequest,
    Read,
    TokensRedeem,
    TokensRevoke,
    TokensTransfer,
    Admin,
}

impl Scope {
    /// Every scope's name, in the order they are listed to an operator.
    pub const NAMES: &'static [&'static str] = &[
        "issuances:write",
        "issuances:request",
        "read",
        "tokens:redeem",
        "tokens:revoke",
        "tokens:transfer",
        "admin",
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::IssuancesWrite => "issuances:write",
            Self::IssuancesRequest => "issuances:request",
            Self::Read => "read",
            Self::TokensRedeem => "tokens:redeem",
            Self::TokensRevoke => "tokens:revoke",
            Self::TokensTransfer => "tokens:transfer",
            Self::Admin => "admin",
        }
    }
}

/// A name that is not one of [`Scope::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope `{0}` (known: {known})", known = Scope::NAMES.join(", "))]
pub struct UnknownScope(pub String);

impl FromStr for Scope {
    type Err = UnknownScope;

    fn from_str(value: &str) -> Result<Self, UnknownScope> {
        Ok(match value {
            "issuances:write" => Self::IssuancesWrite,
            "issuances:request" => Self::IssuancesRequest,
            "read" => Self::Read,
            "tokens:redeem" => Self::TokensRedeem,
            "tokens:revoke" => Self::TokensRevoke,
            "tokens:transfer" => Self::TokensTransfer,
            "admin" => Self::Admin,
            _ => return Err(UnknownScope(value.to_owned())),
        })
    }
}

/// An unknown name is refused as an unknown variant: the configuration's error then names
/// the entry (`auth.keys[0].scopes[1]`) and lists the known scopes, without quoting it.
impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse()
            .map_err(|_| D::Error::unknown_variant(&name, Self::NAMES))
    }
}

/// One entry of an API key's `accounts`. `provider/account` (`stripe/acct_1`) is that
/// account at that provider only; a plain account id (`acct_1`) is that account at every
/// provider, as it always meant. `/` is in neither alphabet, so the forms never overlap
/// (an account id may contain `:`, which therefore cannot separate them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountGrant {
    provider: Option<Provider>,
    account: AccountId,
}

impl AccountGrant {
    /// The rule an entry must meet, as told when a configured one does not.
    pub const RULE: &'static str =
        "must be an account id, or `provider/account` to limit it to one provider";

    pub fn parse(entry: &str) -> Result<Self, &'static str> {
        let (provider, account) = match entry.split_once('/') {
            Some((provider, account)) => (
                Some(Provider::parse(provider).map_err(|_| Self::RULE)?),
                account,
            ),
            None => (None, entry),
        };
        let account = AccountId::parse(account).map_err(|_| Self::RULE)?;
        Ok(Self { provider, account })
    }

    /// Whether this entry covers `account` at `provider`.
    pub fn covers(&self, provider: &str, account: &str) -> bool {
        self.account.as_str() == account
            && self
                .provider
                .as_ref()
                .is_none_or(|p| p.as_str() == provider)
    }

    /// The provider this entry is limited to; `None`: every provider.
    pub fn provider(&self) -> Option<&Provider> {
        self.provider.as_ref()
    }

    pub fn account(&self) -> &AccountId {
        &self.account
    }
}

/// Refused with [`AccountGrant::RULE`], which quotes nothing of the entry.
impl<'de> Deserialize<'de> for AccountGrant {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entry = String::deserialize(deserializer)?;
        Self::parse(&entry).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_parses_from_its_own_name_only() {
        for name in Scope::NAMES {
            assert_eq!(name.parse::<Scope>().map(Scope::as_str), Ok(*name));
        }
        let unknown = "tokens:burn".parse::<Scope>().unwrap_err().to_string();
        assert!(unknown.starts_with("unknown scope `tokens:burn` (known: issuances:write, "));
        assert!("Admin".parse::<Scope>().is_err());
    }

    #[test]
    fn an_account_entry_names_an_account_at_one_or_every_provider() {
        let anywhere = AccountGrant::parse("acct_1").unwrap();
        assert!(anywhere.covers("stripe", "acct_1") && anywhere.covers("paddle", "acct_1"));
        assert!(!anywhere.covers("stripe", "acct_2"));
        let stripe = AccountGrant::parse("stripe/acct_1").unwrap();
        assert!(stripe.covers("stripe", "acct_1"));
        assert!(!stripe.covers("paddle", "acct_1") && !stripe.covers("stripe", "acct_2"));
        // `:` belongs to account ids: `stripe:acct_1` is one account id, at every provider.
        let colon = AccountGrant::parse("stripe:acct_1").unwrap();
        assert_eq!(colon.provider(), None);
        assert!(colon.covers("paddle", "stripe:acct_1"));
        for bad in ["", "/acct_1", "stripe/", "Stripe/acct_1", "a/b/c", "acct 1"] {
            assert!(AccountGrant::parse(bad).is_err(), "{bad:?}");
        }
    }
}
