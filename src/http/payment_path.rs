//! The `/{provider}/{accountId}/{paymentIntentId}` path that names a payment, shared by
//! the issuance and payment reads.

use serde::Deserialize;
use utoipa::IntoParams;

use super::auth::Principal;
use super::error::ApiError;
use crate::domain::{FieldErrors, PaymentKey};

/// A payment's unique key, as path parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Path, rename_all = "camelCase")]
pub struct PaymentPath {
    /// Payment provider.
    #[param(example = "stripe")]
    provider: String,
    /// Merchant account (`default` if none).
    #[param(example = "default")]
    account_id: String,
    /// The provider's payment id.
    #[param(example = "pi_123")]
    payment_intent_id: String,
}

impl PaymentPath {
    /// The validated key (422 naming each bad part), if `principal` may see its account;
    /// otherwise 404 with `not_found`, exactly as for a payment that does not exist (a key
    /// for account A learns nothing of account B).
    pub fn visible_key(
        self,
        principal: &Principal,
        not_found: &str,
    ) -> Result<PaymentKey, ApiError> {
        let mut errors = FieldErrors::default();
        let key = PaymentKey::parse_into(
            &mut errors,
            Some(&self.provider),
            Some(&self.account_id),
            Some(&self.payment_intent_id),
        );
        errors.finish().map_err(ApiError::Validation)?;
        match key {
            Some(key) if principal.can_see(key.provider.as_str(), key.account_id.as_str()) => {
                Ok(key)
            }
            _ => Err(ApiError::NotFound(not_found.to_owned())),
        }
    }
}
