//! Who caused a write: stored with it (an issuance record's `requestedBy`, a token's
//! `lastChangedBy`) and put on the request's log lines, so "who revoked this?" has an
//! answer long after the request is gone.
//!
//! Stored as one string with a prefix naming the kind of actor, so a reader of the
//! database needs no lookup table: `key:<API key id>`, `provider:<provider name>` (a
//! signed webhook, or a revocation its refund caused) or `tokenmint:<task>` (the service's
//! own background work).

use super::Provider;

/// The author of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(String);

impl Actor {
    /// A request authenticated with the API key `key_id` (the configured id, never the key).
    pub fn api_key(key_id: &str) -> Self {
        Self(format!("key:{key_id}"))
    }

    /// A verified delivery of `provider`, or an effect of the payment state it reported.
    pub fn provider(provider: &Provider) -> Self {
        Self(format!("provider:{provider}"))
    }

    /// tokenmint's self-repair, finishing what a crashed request left undone.
    pub fn repair() -> Self {
        Self("tokenmint:repair".to_owned())
    }

    /// An actor as stored (written by one of the constructors above).
    pub fn from_stored(stored: String) -> Self {
        Self(stored)
    }

    /// Whether this is a provider (`provider:…`): a token it revoked, a withdrawal took.
    pub fn is_provider(&self) -> bool {
        self.0.starts_with("provider:")
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_actor_has_its_own_prefix() {
        let stripe = Provider::parse("stripe").unwrap();
        assert_eq!(Actor::api_key("checkout-web").as_str(), "key:checkout-web");
        assert_eq!(Actor::provider(&stripe).as_str(), "provider:stripe");
        assert_eq!(Actor::repair().as_str(), "tokenmint:repair");
        assert!(Actor::provider(&stripe).is_provider());
        assert!(!Actor::api_key("provider").is_provider());
        assert!(!Actor::repair().is_provider());
    }
}
