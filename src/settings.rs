//! The one `Settings` struct and how it is loaded.
//!
//! Layers, later ones winning: the defaults compiled into the binary
//! (`config/default.toml`), `config/<TOKENMINT_ENV>.toml` when present, the file given by
//! `--config` / `TOKENMINT_CONFIG`, then environment variables `TOKENMINT__SECTION__KEY`.
//! Unknown keys are rejected so that a typo in an operator's file is an error, not a
//! silently ignored setting; every validation error names the offending key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use secrecy::SecretString;
use serde::Deserialize;

use crate::domain::{IssuanceMode, Provider};

/// The defaults, compiled in so that the binary runs from any working directory.
const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Everything tokenmint can be configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub mongo: MongoSettings,
    pub migrations: MigrationSettings,
    pub issuance: IssuanceSettings,
    pub version_gate: VersionGateSettings,
    pub auth: AuthSettings,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderSettings>,
    pub webhooks: WebhookSettings,
    pub repair: RepairSettings,
    pub rate_limit: RateLimitSettings,
    pub log: LogSettings,
    /// `TOKENMINT_ENV` (default `development`); not read from files.
    #[serde(skip)]
    pub environment: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on; port 0 picks a free port (the bound address is logged).
    pub bind: SocketAddr,
    pub request_timeout_ms: u64,
    pub body_limit_bytes: usize,
    pub cors_origins: Vec<String>,
    /// How long in-flight requests may run after SIGTERM before the server stops anyway.
    pub shutdown_grace_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MongoSettings {
    /// Empty: start the embedded mongod.
    pub uri: String,
    pub database: String,
    pub server_selection_timeout_ms: u64,
    pub max_pool_size: u32,
    pub embedded: EmbeddedMongoSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedMongoSettings {
    /// Empty: `.tools/mongodb/bin/mongod`, then `mongod` on PATH.
    pub binary: String,
    pub data_dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationSettings {
    pub apply_on_startup: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuanceSettings {
    pub default_mode: IssuanceMode,
    pub max_quantity: u32,
    /// Bounded retries of a token-index duplicate-key race in upsert mode.
    pub duplicate_key_retries: u32,
    /// How long a checkout's pending request waits for the payment's success event
    /// before it expires.
    pub pending_ttl_days: u32,
}

/// Self-repair of token sets a crash left short.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairSettings {
    pub enabled: bool,
    /// How often each instance sweeps for unfinished issuances.
    pub interval_ms: u64,
    /// How old an `issuing` record must be before it counts as abandoned: longer than
    /// any request may take, so a sweep does not race requests still in flight.
    pub min_age_ms: u64,
}

/// The retry policy of the `_version` gate when the client sent no `If-Match`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionGateSettings {
    pub base_delay_ms: u64,
    pub max_jitter_ms: u64,
    pub max_attempts: u32,
    pub budget_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub keys: Vec<ApiKeySettings>,
}

/// One API key: only the SHA-256 of the bearer secret is configured, never the secret.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySettings {
    pub id: String,
    pub sha256: String,
    pub scopes: Vec<String>,
    /// When present, the key only sees these accountIds.
    pub accounts: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    pub scheme: WebhookScheme,
    /// Several at once during rotation. From the environment, never a committed file.
    pub secrets: Vec<SecretString>,
    #[serde(default = "default_tolerance")]
    pub tolerance_secs: u64,
}

fn default_tolerance() -> u64 {
    300
}

/// How a provider signs its webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WebhookScheme {
    Stripe,
    StandardWebhooks,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    pub retention_days: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    pub per_key_per_second: u32,
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

/// A configuration that cannot be used, naming the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("invalid configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: `{key}` {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

impl Settings {
    /// Loads the layered configuration from the process environment.
    pub fn load(config_file: Option<&Path>) -> Result<Self, SettingsError> {
        let environment =
            std::env::var("TOKENMINT_ENV").unwrap_or_else(|_| "development".to_owned());
        let figment = Self::figment(&environment, config_file).merge(
            Env::prefixed("TOKENMINT__")
                .split("__")
                .map(|key| key.as_str().to_ascii_lowercase().into()),
        );
        Self::from_figment(figment, environment)
    }

    /// Defaults + environment file + `--config` file, without environment variables.
    fn figment(environment: &str, config_file: Option<&Path>) -> Figment {
        let mut figment = Figment::new().merge(Toml::string(DEFAULT_TOML));
        let env_file = PathBuf::from(format!("config/{environment}.toml"));
        if env_file.is_file() {
            figment = figment.merge(Toml::file(env_file));
        }
        if let Some(file) = config_file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment
    }

    /// Extracts and validates; used by `load` and by tests that build settings in code.
    pub fn from_figment(figment: Figment, environment: String) -> Result<Self, SettingsError> {
        let mut settings: Settings = figment.extract().map_err(Box::new)?;
        settings.environment = environment;
        settings.validate()?;
        Ok(settings)
    }

    /// The compiled-in defaults with `layers` (TOML texts, later ones winning) on top;
    /// for tests and tools.
    pub fn with_overrides(layers: &[&str]) -> Result<Self, SettingsError> {
        let figment = layers.iter().fold(
            Figment::new().merge(Toml::string(DEFAULT_TOML)),
            |figment, layer| figment.merge(Toml::string(layer)),
        );
        Self::from_figment(figment, "test".to_owned())
    }

    pub fn is_production(&self) -> bool {
        self.environment == "production"
    }

    fn validate(&self) -> Result<(), SettingsError> {
        let positive = [
            ("server.request_timeout_ms", self.server.request_timeout_ms),
            (
                "server.body_limit_bytes",
                self.server.body_limit_bytes as u64,
            ),
            (
                "mongo.server_selection_timeout_ms",
                self.mongo.server_selection_timeout_ms,
            ),
            ("mongo.max_pool_size", u64::from(self.mongo.max_pool_size)),
            (
                "issuance.max_quantity",
                u64::from(self.issuance.max_quantity),
            ),
            (
                "version_gate.max_attempts",
                u64::from(self.version_gate.max_attempts),
            ),
            ("version_gate.budget_ms", self.version_gate.budget_ms),
            (
                "webhooks.retention_days",
                u64::from(self.webhooks.retention_days),
            ),
            (
                "issuance.pending_ttl_days",
                u64::from(self.issuance.pending_ttl_days),
            ),
            ("repair.interval_ms", self.repair.interval_ms),
            (
                "rate_limit.per_key_per_second",
                u64::from(self.rate_limit.per_key_per_second),
            ),
            ("rate_limit.burst", u64::from(self.rate_limit.burst)),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, "must be greater than 0"));
            }
        }
        if self.issuance.max_quantity > 100_000 {
            return Err(invalid("issuance.max_quantity", "must be at most 100000"));
        }
        if self.mongo.database.is_empty() || self.mongo.database.contains(['.', '/', ' ', '$']) {
            return Err(invalid("mongo.database", "must be a valid database name"));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid("log.level", "is not a valid log filter"));
        }
        self.validate_keys()?;
        self.validate_providers()
    }

    fn validate_keys(&self) -> Result<(), SettingsError> {
        for (i, key) in self.auth.keys.iter().enumerate() {
            let at = format!("auth.keys[{i}]");
            if key.id.trim().is_empty() {
                return Err(invalid(format!("{at}.id"), "must not be empty"));
            }
            let hex_ok =
                key.sha256.len() == 64 && key.sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex_ok {
                return Err(invalid(
                    format!("{at}.sha256"),
                    "must be the 64 hex digits of the key's SHA-256",
                ));
            }
            if key.scopes.is_empty() {
                return Err(invalid(
                    format!("{at}.scopes"),
                    "must name at least one scope",
                ));
            }
            for scope in &key.scopes {
                if crate::domain::Scope::parse(scope).is_none() {
                    return Err(invalid(
                        format!("{at}.scopes"),
                        format!("has unknown scope `{scope}`"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_providers(&self) -> Result<(), SettingsError> {
        use secrecy::ExposeSecret;
        for (name, provider) in &self.providers {
            let at = format!("providers.{name}");
            if Provider::parse(name).is_err() {
                return Err(invalid(at, "is not a valid provider name"));
            }
            if provider.secrets.is_empty() {
                return Err(invalid(
                    format!("{at}.secrets"),
                    "must hold at least one secret",
                ));
            }
            if provider
                .secrets
                .iter()
                .any(|s| s.expose_secret().trim().is_empty())
            {
                return Err(invalid(
                    format!("{at}.secrets"),
                    "must not contain an empty secret",
                ));
            }
            if provider.tolerance_secs == 0 {
                return Err(invalid(
                    format!("{at}.tolerance_secs"),
                    "must be greater than 0",
                ));
            }
        }
        Ok(())
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.server.request_timeout_ms)
    }

    pub fn server_selection_timeout(&self) -> Duration {
        Duration::from_millis(self.mongo.server_selection_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let settings = Settings::with_overrides(&[""]).expect("defaults load");
        assert_eq!(settings.issuance.max_quantity, 1000);
        assert_eq!(settings.issuance.default_mode, IssuanceMode::Upsert);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Settings::with_overrides(&["[issuance]\nmax_quanity = 3"]).unwrap_err();
        assert!(err.to_string().contains("max_quanity"), "{err}");
    }

    #[test]
    fn zero_values_name_their_key() {
        let err = Settings::with_overrides(&["[issuance]\nmax_quantity = 0"]).unwrap_err();
        assert!(err.to_string().contains("issuance.max_quantity"), "{err}");
    }

    #[test]
    fn bad_key_hash_is_named() {
        let toml = "[[auth.keys]]\nid = \"a\"\nsha256 = \"zz\"\nscopes = [\"admin\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("auth.keys[0].sha256"), "{err}");
    }

    #[test]
    fn empty_provider_secret_is_rejected() {
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(
            err.to_string().contains("providers.stripe.secrets"),
            "{err}"
        );
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"x\"]\ntolerance_secs = 0";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("tolerance_secs"), "{err}");
    }
}
