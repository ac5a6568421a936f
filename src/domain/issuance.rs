//! What an issuance request asks for, once validated.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AccountId, Owner, PaymentIntentId, Provider, Quantity, TokenType};

/// How the store writes an issuance.
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

/// Where an issuance record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IssuanceStatus {
    /// Requested by a checkout frontend; waits for the payment to succeed, and expires
    /// if it never does.
    Pending,
    /// Authorised, and its tokens are being written: the set may still be partial (a
    /// writer crashed), which self-repair completes.
    Issuing,
    /// Complete: exactly `quantity` tokens exist, checked against the payment's state.
    Issued,
}

impl IssuanceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Issuing => "issuing",
            Self::Issued => "issued",
        }
    }
}

/// The unique key of a payment: the same payment id may exist at two providers or accounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PaymentKey {
    pub provider: Provider,
    pub account_id: AccountId,
    pub payment_intent_id: PaymentIntentId,
}

/// The parameters a retry must repeat exactly (retry verification).
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
    /// Stored on the issuance record as `requestedBy` when this request creates it.
    pub requested_by: super::Actor,
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

/// One parameter in which a request differs from the recorded issuance.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Mismatch {
    pub field: String,
    /// The recorded value (a string or an integer, as the field is). Left out where the
    /// caller may not read it (a redemption whose tokens are outside the key's accounts).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub existing: Option<serde_json::Value>,
    /// The value this request asked for.
    #[schema(value_type = Value)]
    pub requested: serde_json::Value,
}

impl Mismatch {
    /// The fields whose recorded value differs from the requested one, from
    /// `(field, recorded, requested)` triples, in their order.
    pub fn among<'a>(
        fields: impl IntoIterator<Item = (&'a str, serde_json::Value, serde_json::Value)>,
    ) -> Vec<Mismatch> {
        fields
            .into_iter()
            .filter(|(_, existing, requested)| existing != requested)
            .map(|(field, existing, requested)| Mismatch {
                field: field.to_owned(),
                existing: Some(existing),
                requested,
            })
            .collect()
    }
}

impl IssuanceParams {
    /// Every field in which `requested` differs from these (the recorded) parameters.
    /// paymentDate is set on first insert only and is deliberately not a parameter.
    pub fn mismatches(&self, requested: &IssuanceParams) -> Vec<Mismatch> {
        let fields: [(&str, serde_json::Value, serde_json::Value); 3] = [
            (
                "owner",
                self.owner.to_string().into(),
                requested.owner.to_string().into(),
            ),
            (
                "tokenType",
                self.token_type.as_str().into(),
                requested.token_type.as_str().into(),
            ),
            (
                "quantity",
                self.quantity.get().into(),
                requested.quantity.get().into(),
            ),
        ];
        Mismatch::among(fields)
    }
}
