//! The permissions an API key can hold.

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
