//! Validated domain types. Request DTOs are parsed into these once, at the HTTP edge;
//! everything past the edge (the store, the webhooks) only ever sees valid values, so a
//! field value can never turn into a MongoDB operator or field path.

mod actor;
mod client;
mod idempotency;
mod identifiers;
mod issuance;
mod money;
mod owner;
mod packs;
mod payment;
mod pricing;
mod quantity;
mod redemption;
mod scope;
mod token;

pub use actor::Actor;
pub use client::ClientAddress;
pub use idempotency::IdempotencyKey;
pub use identifiers::{
    AccountId, DOT_SEGMENT_RULE, OBJECT_ID_PATTERN, PaymentIntentId, Provider, RedemptionReference,
    TokenType,
};
pub use issuance::{
    IssuanceMode, IssuanceParams, IssuanceStatus, Mismatch, NewIssuance, PaymentKey,
};
pub use money::{
    Entitlement, Money, RecordedRelease, ReleaseReport, Reversal, RevocationReason, ShareTaken,
    UNCAPTURED_KIND, Withdrawal, entitlement, share_taken,
};
pub use owner::Owner;
pub use packs::{PaidItem, TokenPacks, TokensBought};
pub use payment::{CapturedPart, EventOutcome, ParsedEvent, PaymentEvent, PaymentStatus, Refund};
pub use pricing::TokenPrices;
pub use quantity::Quantity;
pub use redemption::NewRedemption;
pub use scope::{AccountGrant, Scope, UnknownScope};
pub use token::{TokenId, TokenStatus};

/// One rejected input field, as listed in a 422 answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The JSON field (or path/query parameter) at fault, as the client spelled it.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Collects every bad field of a request so that the client hears of all of them at once.
#[derive(Debug, Default)]
pub struct FieldErrors(Vec<FieldError>);

impl FieldErrors {
    /// Keeps the parsed value, or records the error under `field` and returns `None`.
    pub fn check<T>(&mut self, field: &str, parsed: Result<T, String>) -> Option<T> {
        match parsed {
            Ok(value) => Some(value),
            Err(message) => {
                self.0.push(FieldError::new(field, message));
                None
            }
        }
    }

    /// Like `check`, for a field the request must carry.
    pub fn required<T>(&mut self, field: &str, parsed: Option<Result<T, String>>) -> Option<T> {
        match parsed {
            Some(parsed) => self.check(field, parsed),
            None => self.check(field, Err("is required".to_owned())),
        }
    }

    /// A required JSON string field: absent or null → "is required", another JSON type →
    /// "must be a string", else `parse`d. Type errors are reported like any other, so one
    /// answer still lists every bad field.
    pub fn required_text<T>(
        &mut self,
        field: &str,
        value: Option<&serde_json::Value>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        self.optional_text(field, value, parse)?
            .or_else(|| self.check(field, Err("is required".to_owned())))
    }

    /// An optional JSON string field: `Some(None)` when absent or null, `None` when bad
    /// (the error is recorded).
    pub fn optional_text<T>(
        &mut self,
        field: &str,
        value: Option<&serde_json::Value>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<Option<T>> {
        match value {
            None | Some(serde_json::Value::Null) => Some(None),
            Some(serde_json::Value::String(text)) => self.check(field, parse(text)).map(Some),
            Some(_) => self.check(field, Err("must be a string".to_owned())),
        }
    }

    pub fn push(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    /// `Err` with every recorded error, or `Ok` when there were none.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}
