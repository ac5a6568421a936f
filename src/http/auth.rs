//! API keys: `Authorization: Bearer <key>`; only SHA-256 hashes are
//! configured. The presented key is hashed and compared with every configured hash in
//! constant time, so neither the comparison nor the lookup leaks how close a guess was.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;
use super::rate_limit::AdmittedBy;
use crate::domain::{AccountGrant, ClientAddress, PaymentKey, Scope};
use crate::settings::ApiKeySettings;

/// The authenticated caller of a request.
#[derive(Debug)]
pub struct Principal {
    /// The configured key id: safe to log, unlike the key.
    pub key_id: String,
    scopes: Vec<Scope>,
    accounts: Option<Vec<AccountGrant>>,
}

impl Principal {
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes
            .iter()
            .any(|s| *s == scope || *s == Scope::Admin)
    }

    /// Whether this is a checkout key: one holding `issuances:request` and nothing else,
    /// public by design (it ships to browsers), so limited per client address.
    pub fn is_checkout(&self) -> bool {
        !self.scopes.is_empty() && self.scopes.iter().all(|s| *s == Scope::IssuancesRequest)
    }

    /// 403 unless the key holds `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "This API key lacks the scope `{}`.",
                scope.as_str()
            )))
        }
    }

    /// The accounts the key is limited to; `None` when it sees all.
    pub fn accounts(&self) -> Option<&[AccountGrant]> {
        self.accounts.as_deref()
    }

    /// Whether the key may see data of `account` at `provider`: keys without an account
    /// list see all, others what one of their entries covers.
    pub fn can_see(&self, provider: &str, account: &str) -> bool {
        self.accounts
            .as_ref()
            .is_none_or(|grants| grants.iter().any(|g| g.covers(provider, account)))
    }

    /// 403 when the key may not act on the payment's account (used where the client names
    /// the account itself, e.g. in a POST body; reads of foreign data answer 404 instead).
    pub fn require_account(&self, key: &PaymentKey) -> Result<(), ApiError> {
        if self.can_see(key.provider.as_str(), key.account_id.as_str()) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "This API key is not allowed for account `{}` at provider `{}`.",
                key.account_id, key.provider
            )))
        }
    }
}

/// The configured keys, by hash.
pub struct ApiKeys {
    keys: Vec<([u8; 32], Arc<Principal>)>,
}

impl ApiKeys {
    /// Builds the registry from validated settings (hashes are 64 hex digits; scopes and
    /// accounts were parsed with them).
    pub fn from_settings(keys: &[ApiKeySettings]) -> Self {
        let keys = keys
            .iter()
            .map(|key| {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(&key.sha256, &mut hash).expect("validated sha256 hex");
                let principal = Principal {
                    key_id: key.id.clone(),
                    scopes: key.scopes.clone(),
                    accounts: key.accounts.clone(),
                };
                (hash, Arc::new(principal))
            })
            .collect();
        Self { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The principal of `presented`, if it is a configured key.
    pub fn authenticate(&self, presented: &str) -> Option<Arc<Principal>> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        // Compare against every key, even after a match, so timing says nothing.
        for (candidate, principal) in &self.keys {
            if bool::from(candidate.ct_eq(&hash)) {
                found = Some(principal.clone());
            }
        }
        found
    }
}

/// The hex SHA-256 of a bearer key, as it goes into `[[auth.keys]] sha256`.
pub fn key_hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The prefix of development keys.
pub const DEV_KEY_PREFIX: &str = "tm_dev_";

/// A fresh random bearer key: `prefix` then 48 hex digits (192 random bits).
pub fn random_key(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(rand::random::<[u8; 24]>()))
}

/// Whether `key` has the shape of a development key (so a damaged key file is noticed).
pub fn is_dev_key(key: &str) -> bool {
    key.strip_prefix(DEV_KEY_PREFIX)
        .is_some_and(|hex| hex.len() == 48 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `[[auth.keys]]` entry of the development admin key `key`.
pub fn dev_key_settings(key: &str) -> ApiKeySettings {
    ApiKeySettings {
        id: "dev-admin".to_owned(),
        sha256: key_hash(key),
        scopes: vec![Scope::Admin],
        accounts: None,
    }
}

impl FromRequestParts<AppState> for Arc<Principal> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Authenticated already by a layer that needed the caller first (idempotency
        // keys are scoped per API key): once per request, so once against the rate limit.
        if let Some(principal) = parts.extensions.get::<Arc<Principal>>() {
            return Ok(principal.clone());
        }
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or(ApiError::Unauthorized(
                "Missing Authorization: Bearer <key> header.",
            ))?;
        let key = header
            .to_str()
            .ok()
            // The scheme is case-insensitive (RFC 9110 §11.1): `bearer <key>` is fine too.
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
            .map(|(_, key)| key.trim())
            .filter(|k| !k.is_empty())
            .ok_or(ApiError::Unauthorized(
                "The Authorization header must be `Bearer <key>`.",
            ))?;
        let principal = state
            .keys
            .authenticate(key)
            .ok_or(ApiError::Unauthorized("Unknown API key."))?;
        // The request's span (`middleware`) declared the field; the id, never the key.
        tracing::Span::current().record("key_id", principal.key_id.as_str());
        // Anyone may hold a checkout key: its allowance is the client address's, so one
        // abuser cannot spend every shopper's.
        let admitted = if principal.is_checkout() {
            let client = ClientAddress::from_request_parts(parts, state).await?;
            state.rate_limits.check_address(client)?
        } else {
            state.rate_limits.check_key(&principal.key_id)?
        };
        if let Some(slot) = parts.extensions.get::<AdmittedBy>() {
            slot.record(admitted);
        }
        Ok(principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh random admin key, as a development start makes one.
    fn generate_dev_key() -> (String, ApiKeySettings) {
        let key = random_key(DEV_KEY_PREFIX);
        let settings = dev_key_settings(&key);
        (key, settings)
    }

    fn registry() -> (String, ApiKeys) {
        let (key, mut settings) = generate_dev_key();
        settings.scopes = vec![Scope::Read];
        settings.accounts = Some(vec![AccountGrant::parse("acct_1").unwrap()]);
        (key, ApiKeys::from_settings(&[settings]))
    }

    #[test]
    fn authenticates_only_the_configured_key() {
        let (key, keys) = registry();
        let principal = keys.authenticate(&key).expect("known key");
        assert!(principal.has(Scope::Read));
        assert!(!principal.has(Scope::TokensRedeem));
        assert!(keys.authenticate("tm_dev_wrong").is_none());
    }

    #[test]
    fn only_a_key_of_issuances_request_alone_is_a_checkout_key() {
        let principal = |scopes: &[&str]| {
            let (key, mut settings) = generate_dev_key();
            settings.scopes = scopes.iter().map(|s| s.parse().unwrap()).collect();
            ApiKeys::from_settings(&[settings])
                .authenticate(&key)
                .unwrap()
        };
        assert!(principal(&["issuances:request"]).is_checkout());
        assert!(principal(&["issuances:request", "issuances:request"]).is_checkout());
        for trusted in [
            &["issuances:request", "read"][..],
            &["issuances:write"],
            &["admin"],
            &["read"],
        ] {
            assert!(!principal(trusted).is_checkout(), "{trusted:?}");
        }
    }

    #[test]
    fn accounts_limit_visibility() {
        let (key, keys) = registry();
        let principal = keys.authenticate(&key).unwrap();
        assert!(principal.can_see("stripe", "acct_1"));
        assert!(principal.can_see("paddle", "acct_1"));
        assert!(!principal.can_see("stripe", "acct_2"));
    }
}
