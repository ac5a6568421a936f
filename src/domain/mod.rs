//! Validated domain types. Request DTOs are parsed into these once, at the HTTP edge;
//! everything past the edge (the store, the webhooks) only ever sees valid values, so a
//! field value can never turn into a MongoDB operator or field path.

mod identifiers;
mod issuance;
mod owner;
mod payment;
mod quantity;
mod token;

pub use identifiers::{AccountId, PaymentIntentId, Provider, TokenType};
pub use issuance::{IssuanceMode, IssuanceParams, IssuanceStatus, NewIssuance, PaymentKey};
pub use owner::Owner;
pub use payment::PaymentStatus;
pub use quantity::Quantity;
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
