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

/// Why a delivery was refused before any processing.
#[derive(Debug)]
pub enum Rejection {
    UnknownProvider,
    Signature(SignatureError),
    Malformed(String),
}

/// The configured providers, by name.
#[derive(Default)]
pub struct Providers(HashMap<String, ProviderConfig>);

impl Providers {
    /// From validated settings (names are valid provider identifiers, secrets non-empty).
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

    /// Verifies the signature over the raw `body`, then parses it. Nothing is parsed
    /// before the signature holds.
    pub fn verify_and_parse(
        &self,
        provider: &str,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        now: i64,
        max_quantity: u32,
    ) -> Result<ParsedEvent, Rejection> {
        let config = self.0.get(provider).ok_or(Rejection::UnknownProvider)?;
        match config.scheme {
            WebhookScheme::Stripe => {
                signature::verify_stripe(
                    headers,
                    body,
                    &config.secrets,
                    config.tolerance_secs,
                    now,
                )
                .map_err(Rejection::Signature)?;
                parse_stripe(&config.name, body, max_quantity)
                    .map_err(|e| Rejection::Malformed(e.0))
            }
            WebhookScheme::StandardWebhooks => {
                signature::verify_standard(
                    headers,
                    body,
                    &config.secrets,
                    config.tolerance_secs,
                    now,
                )
                .map_err(Rejection::Signature)?;
                let id = headers.webhook_id.unwrap_or_default();
                parse_standard(&config.name, id, body, max_quantity)
                    .map_err(|e| Rejection::Malformed(e.0))
            }
        }
    }
}
