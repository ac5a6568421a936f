//! Payment providers as webhook senders: signature verification and event parsing into
//! domain events. What an event does is `issuing`'s to decide.

mod events;
pub mod signature;

use std::collections::HashMap;

use secrecy::SecretString;

pub use events::{EventError, parse_standard, parse_stripe};
pub use signature::{SignatureError, SignatureHeaders};

use crate::domain::{ParsedEvent, Provider};
use crate::settings::{ProviderSettings, WebhookScheme};

/// One configured provider.
pub struct ProviderConfig {
    pub name: Provider,
    pub scheme: WebhookScheme,
    secrets: Vec<SecretString>,
    tolerance_secs: u64,
}

/// The configured providers, by name.
#[derive(Default)]
pub struct Providers(HashMap<String, ProviderConfig>);

impl Providers {
    /// From validated settings: names are valid provider identifiers and every secret
    /// passed [`signature::check_secret`] for its scheme (`Settings::validate`), so
    /// nothing is left out here.
    pub fn from_settings(providers: &std::collections::BTreeMap<String, ProviderSettings>) -> Self {
        Self(
            providers
                .iter()
                .filter_map(|(name, settings)| {
                    let config = ProviderConfig {
                        name: Provider::parse(name).ok()?,
                        scheme: settings.scheme,
                        secrets: settings.secrets.clone(),
                        tolerance_secs: settings.tolerance_secs,
                    };
                    Some((name.clone(), config))
                })
                .collect(),
        )
    }

    pub fn contains(&self, provider: &str) -> bool {
        self.0.contains_key(provider)
    }

    /// The provider configured as `provider`, if any.
    pub fn get(&self, provider: &str) -> Option<&ProviderConfig> {
        self.0.get(provider)
    }
}

impl ProviderConfig {
    /// Verifies the delivery's signature over the raw `body`, per the provider's scheme.
    pub fn verify(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let verify = match self.scheme {
            WebhookScheme::Stripe => signature::verify_stripe,
            WebhookScheme::StandardWebhooks => signature::verify_standard,
        };
        verify(headers, body, &self.secrets, self.tolerance_secs, now)
    }

    /// Parses a delivery whose signature [`verify`](Self::verify) accepted; nothing is
    /// parsed before that. `Err` is a body that is not an event (400).
    pub fn parse(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        max_quantity: u32,
    ) -> Result<ParsedEvent, EventError> {
        match self.scheme {
            WebhookScheme::Stripe => parse_stripe(&self.name, body, max_quantity),
            WebhookScheme::StandardWebhooks => {
                let id = headers.webhook_id.unwrap_or_default();
                parse_standard(&self.name, id, body, max_quantity)
            }
        }
    }
}
