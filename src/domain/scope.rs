//! The permissions an API key can hold, and the accounts it may be limited to.

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
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "issuances:write" => Self::IssuancesWrite,
            "issuances:request" => Self::IssuancesRequest,
            "read" => Self::Read,
            "tokens:redeem" => Self::TokensRedeem,
            "tokens:revoke" => Self::TokensRevoke,
            "tokens:transfer" => Self::TokensTransfer,
            "admin" => Self::Admin,
            _ => return None,
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

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
