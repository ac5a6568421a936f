//! Token identity and lifecycle states.

use std::fmt;

use mongodb::bson::oid::ObjectId;
use serde::{Deserialize, Serialize};

/// A token's `_id`, given in URLs as 24 hex characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId(ObjectId);

impl TokenId {
    pub fn parse(value: &str) -> Result<Self, String> {
        ObjectId::parse_str(value)
            .map(Self)
            .map_err(|_| "must be a 24-character hex token id".to_owned())
    }

    pub fn object_id(self) -> ObjectId {
        self.0
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.to_hex())
    }
}

/// Where a token is in its life. `active` is the only state a token can leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenStatus {
    Active,
    Redeemed,
    Revoked,
}

impl TokenStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Redeemed => "redeemed",
            Self::Revoked => "revoked",
        }
    }

    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "active" => Ok(Self::Active),
            "redeemed" => Ok(Self::Redeemed),
            "revoked" => Ok(Self::Revoked),
            _ => Err("must be one of active, redeemed, revoked".to_owned()),
        }
    }
}
