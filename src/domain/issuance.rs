//! What an issuance request asks for, once validated.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AccountId, Owner, PaymentIntentId, Provider, Quantity, TokenType};

/// How the store writes an issuance (PRODUCT.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IssuanceMode {
    /// Idempotent, convergent unordered bulk upsert; a crash may leave a partial set that
    /// the next identical request completes.
    Upsert,
    /// All-or-nothing multi-document transaction.
    Atomic,
}

impl IssuanceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upsert => "upsert",
            Self::Atomic => "atomic",
        }
    }

    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "upsert" => Ok(Self::Upsert),
            "atomic" => Ok(Self::Atomic),
            _ => Err("must be \"upsert\" or \"atomic\"".to_owned()),
        }
    }
}

/// Whether an issuance's tokens are owed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IssuanceStatus {
    /// Requested by a checkout frontend; waits for the payment to succeed.
    Pending,
    /// Authorised: exactly `quantity` tokens exist (or converge on the next retry).
    Issued,
}

/// The unique key of a payment: the same payment id may exist at two providers or accounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PaymentKey {
    pub provider: Provider,
    pub account_id: AccountId,
    pub payment_intent_id: PaymentIntentId,
}

/// The parameters a retry must repeat exactly (retry verification, PRODUCT.md §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuanceParams {
    pub owner: Owner,
    pub token_type: TokenType,
    pub quantity: Quantity,
}

/// A validated request to issue tokens for a payment.
#[derive(Debug, Clone)]
pub struct NewIssuance {
    pub key: PaymentKey,
    pub params: IssuanceParams,
    /// Set on first insert only; never compared on retry.
    pub payment_date: DateTime<Utc>,
    pub mode: IssuanceMode,
}

impl PaymentKey {
    /// Parses the three parts of a payment key, recording each bad one in `errors`.
    pub fn parse_into(
        errors: &mut super::FieldErrors,
        provider: Option<&str>,
        account_id: Option<&str>,
        payment_intent_id: Option<&str>,
    ) -> Option<Self> {
        let provider = errors.required("provider", provider.map(Provider::parse));
        let account_id = match account_id {
            Some(account) => errors.check("accountId", AccountId::parse(account)),
            None => Some(AccountId::default()),
        };
        let payment_intent_id = errors.required(
            "paymentIntentId",
            payment_intent_id.map(PaymentIntentId::parse),
        );
        Some(Self {
            provider: provider?,
            account_id: account_id?,
            payment_intent_id: payment_intent_id?,
        })
    }
}
