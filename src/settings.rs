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
use crate::webhooks::signature::check_secret;

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
    /// How long a client may take to send a request's headers; also how long an idle
    /// keep-alive connection stays open.
    pub header_read_timeout_ms: u64,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
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
    /// Checkout requests that may wait for their payment's event at once (`Prefer:
    /// wait`) on one instance; beyond it a request is answered at once.
    pub max_waiters: u32,
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
    /// How far back each sweep settles refunded or canceled payments again (covers an
    /// atomic issuance whose process died between its commit and its settle).
    pub withdrawal_lookback_ms: u64,
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
    Paddle,
    Adyen,
}

impl std::fmt::Display for WebhookScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Stripe => "stripe",
            Self::StandardWebhooks => "standard-webhooks",
            Self::Paddle => "paddle",
            Self::Adyen => "adyen",
        })
    }
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

/// The most tokens one issuance may carry; `issuance.max_quantity` may not exceed it.
///
/// Upsert mode writes an issuance's tokens in ONE `update` command, one upsert statement
/// per token (`store/token_bulk.rs`: one round trip, converging whatever exists), and
/// MongoDB refuses a command document over 16 MiB (+16 KiB). A statement is ~300–400
/// bytes with ordinary ids and under 1 KiB with every id at its longest (provider 32,
/// accountId 64, paymentIntentId 128, tokenType 64 characters; the payment key is
/// written twice, in the filter and in `origin`): 10 000 statements stay under 10 MiB,
/// with room to spare for a field added to tokens later.
/// (`tests/api/hardening.rs` issues 10 000 tokens with the longest ids in one write.)
pub const MAX_QUANTITY: u32 = 10_000;

/// A configuration that cannot be used. Every message names the key at fault and the
/// kind of problem, and never the value, which may be a secret.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// Reading or deserializing failed (each problem found, separated by `; `).
    #[error("invalid configuration: {0}")]
    Load(String),
    #[error("invalid configuration: `{key}` {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// A figment error as one line per problem, each naming the key, the kind of problem and
/// where the value came from, but never the value itself. (figment's own message quotes
/// the value: `TOKENMINT__PROVIDERS__STRIPE__SECRETS=whsec_…` given as a bare string
/// instead of a list would print the secret.)
fn load_error(figment: &Figment, error: figment::Error) -> SettingsError {
    let lines: Vec<String> = error.into_iter().map(|e| describe(figment, &e)).collect();
    SettingsError::Load(lines.join("; "))
}

fn describe(figment: &Figment, error: &figment::Error) -> String {
    use figment::error::Kind;
    let mut path = error.path.clone();
    let problem = match &error.kind {
        Kind::InvalidType(actual, expected) => {
            format!("must be {expected}, not {}", kind_of(actual))
        }
        Kind::InvalidValue(_, expected) => format!("has an invalid value (expected {expected})"),
        Kind::InvalidLength(_, expected) => {
            format!("has the wrong number of items (expected {expected})")
        }
        Kind::UnknownVariant(_, expected) => format!("must be one of {}", one_of(expected)),
        // figment's path may already end with the field's name.
        Kind::UnknownField(field, _) => {
            push_field(&mut path, field);
            "is not a known key".to_owned()
        }
        Kind::MissingField(field) => {
            push_field(&mut path, field);
            "is required".to_owned()
        }
        Kind::DuplicateField(field) => {
            push_field(&mut path, field);
            "is given more than once".to_owned()
        }
        Kind::ISizeOutOfRange(_) | Kind::USizeOutOfRange(_) => "is out of range".to_owned(),
        Kind::Unsupported(actual) => format!("has an unsupported type ({})", kind_of(actual)),
        Kind::UnsupportedKey(actual, expected) => {
            format!(
                "has a key of the wrong type ({}, expected {expected})",
                kind_of(actual)
            )
        }
        // A free-form message (a file that cannot be read or parsed, a value a type's
        // parser refused) may quote what it read. Only its first line is kept — a TOML
        // parse error's position, not the snippet below it — and for a key, only when
        // it quotes no part of the value.
        Kind::Message(message) => {
            let first = message.lines().next().unwrap_or_default();
            if path.is_empty() {
                first.to_owned()
            } else if quotes_no_value(first, figment.find_value(&path.join(".")).ok()) {
                format!("has an invalid value ({first})")
            } else {
                "has an invalid value".to_owned()
            }
        }
    };
    let key = if path.is_empty() {
        String::new()
    } else {
        format!("`{}` ", path.join("."))
    };
    format!("{key}{problem}{}", origin_of(error, &path))
}

fn push_field(path: &mut Vec<String>, field: &str) {
    if path.last().map(String::as_str) != Some(field) {
        path.push(field.to_owned());
    }
}

/// Whether `message` quotes none of `value`: neither a whole scalar in it nor any eight
/// characters in a row of one. Without a value to compare, it might.
fn quotes_no_value(message: &str, value: Option<figment::value::Value>) -> bool {
    use figment::value::Value;
    fn scalars(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(_, s) => out.push(s.clone()),
            Value::Char(_, c) => out.push(c.to_string()),
            Value::Bool(_, b) => out.push(b.to_string()),
            Value::Num(_, n) => out.push(match (n.to_u128(), n.to_i128()) {
                (Some(u), _) => u.to_string(),
                (None, Some(i)) => i.to_string(),
                (None, None) => n.to_f64().unwrap_or_default().to_string(),
            }),
            Value::Empty(..) => {}
            Value::Dict(_, dict) => dict.values().for_each(|v| scalars(v, out)),
            Value::Array(_, items) => items.iter().for_each(|v| scalars(v, out)),
        }
    }
    let Some(value) = value else {
        return false;
    };
    let mut found = Vec::new();
    scalars(&value, &mut found);
    found.iter().all(|scalar| {
        let chars: Vec<char> = scalar.chars().collect();
        !message.contains(scalar.as_str())
            && chars
                .windows(8)
                .all(|w| !message.contains(&w.iter().collect::<String>()))
    })
}

/// Where a value came from: the environment variable, or the file.
fn origin_of(error: &figment::Error, path: &[String]) -> String {
    let Some(metadata) = &error.metadata else {
        return String::new();
    };
    if metadata.name.contains("environment variable") {
        if path.is_empty() {
            return " (environment)".to_owned();
        }
        let variable = format!("{ENV_PREFIX}{}", path.join("__").to_ascii_uppercase());
        return format!(" (environment variable {variable})");
    }
    match &metadata.source {
        Some(source) => format!(" (in {} {source})", metadata.name),
        None => format!(" (in {})", metadata.name),
    }
}

/// What kind of value was given, without the value.
fn kind_of(actual: &figment::error::Actual) -> &'static str {
    use figment::error::Actual;
    match actual {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a number",
        Actual::Char(_) => "a character",
        Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit | Actual::Option => "empty",
        Actual::Seq => "a list",
        Actual::Map => "a table",
        Actual::NewtypeStruct
        | Actual::Enum
        | Actual::UnitVariant
        | Actual::NewtypeVariant
        | Actual::TupleVariant
        | Actual::StructVariant
        | Actual::Other(_) => "another kind of value",
    }
}

fn one_of(expected: &[&str]) -> String {
    let names: Vec<String> = expected.iter().map(|e| format!("`{e}`")).collect();
    names.join(", ")
}

/// Browsers send `Origin` as `scheme://host[:port]`, lower-case, without a path or the
/// scheme's default port, and CORS compares it byte for byte: anything else in
/// `server.cors_origins` would never match, so it is refused rather than ignored.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    const SHAPE: &str = "is not an origin: expected `https://host` or `http://host:port`";
    if origin == "*" {
        return Err("must name an origin (`*` is not allowed: list each checkout origin)");
    }
    let uri: axum::http::Uri = origin.parse().map_err(|_| SHAPE)?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(SHAPE);
    };
    if !matches!(scheme, "http" | "https") {
        return Err("must use the `http` or `https` scheme");
    }
    if origin != format!("{scheme}://{authority}") || authority.as_str().contains('@') {
        return Err(
            "must be only `scheme://host[:port]`, without a path, a trailing `/` or user information",
        );
    }
    if origin.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("must be lower-case, as browsers send it");
    }
    if matches!(
        (scheme, authority.port_u16()),
        ("https", Some(443)) | ("http", Some(80))
    ) {
        return Err("must leave out the scheme's default port, as browsers do");
    }
    axum::http::HeaderValue::from_str(origin).map_err(|_| SHAPE)?;
    Ok(())
}

/// The prefix of configuration environment variables.
const ENV_PREFIX: &str = "TOKENMINT__";

impl Settings {
    /// Loads the layered configuration from the process environment.
    pub fn load(config_file: Option<&Path>) -> Result<Self, SettingsError> {
        let environment =
            std::env::var("TOKENMINT_ENV").unwrap_or_else(|_| "development".to_owned());
        let figment = Self::figment(&environment, config_file).merge(
            Env::prefixed(ENV_PREFIX)
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
        let mut settings: Settings = figment
            .extract()
            .map_err(|error| load_error(&figment, error))?;
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
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            ("server.max_connections", self.server.max_connections as u64),
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
            ("issuance.max_waiters", u64::from(self.issuance.max_waiters)),
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
        if self.issuance.max_quantity > MAX_QUANTITY {
            return Err(invalid(
                "issuance.max_quantity",
                format!(
                    "must be at most {MAX_QUANTITY} (the tokens of one issuance are written in one command)"
                ),
            ));
        }
        for (i, origin) in self.server.cors_origins.iter().enumerate() {
            if let Err(problem) = check_origin(origin) {
                return Err(invalid(format!("server.cors_origins[{i}]"), problem));
            }
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
            for (j, scope) in key.scopes.iter().enumerate() {
                if crate::domain::Scope::parse(scope).is_none() {
                    return Err(invalid(format!("{at}.scopes[{j}]"), "is not a known scope"));
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
            for (i, secret) in provider.secrets.iter().enumerate() {
                if let Err(problem) = check_secret(provider.scheme, secret.expose_secret()) {
                    return Err(invalid(
                        format!("{at}.secrets[{i}]"),
                        format!(
                            "(provider `{name}`, scheme `{}`) {problem}",
                            provider.scheme
                        ),
                    ));
                }
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
        assert_eq!(settings.issuance.max_waiters, 1000);
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
        let err = Settings::with_overrides(&["[issuance]\nmax_waiters = 0"]).unwrap_err();
        assert!(err.to_string().contains("issuance.max_waiters"), "{err}");
    }

    #[test]
    fn bad_key_hash_is_named() {
        let toml = "[[auth.keys]]\nid = \"a\"\nsha256 = \"zz\"\nscopes = [\"admin\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("auth.keys[0].sha256"), "{err}");
    }

    /// Loads `layers`, expecting an error; asserts it is one line, said once, names
    /// `key`, and quotes none of `values`.
    fn refused(layers: &[&str], key: &str, values: &[&str]) -> String {
        let err = Settings::with_overrides(layers).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
        for value in values {
            assert!(!err.contains(value), "{value:?} echoed in: {err}");
        }
        assert_eq!(err.matches("invalid configuration").count(), 1, "{err}");
        assert!(!err.contains('\n'), "{err}");
        err
    }

    const SECRET_LIKE: &str = "whsec_Sup3rS3cretValueThatMustNeverBePrinted";

    #[test]
    fn load_errors_name_the_key_and_never_the_value() {
        // A bare string where a list belongs (the `TOKENMINT__…__SECRETS=whsec_…` mistake).
        let bare = format!("[providers.stripe]\nscheme = \"stripe\"\nsecrets = \"{SECRET_LIKE}\"");
        let err = refused(
            &[&bare],
            "`providers.stripe.secrets`",
            &[SECRET_LIKE, "Sup3r"],
        );
        assert!(err.contains("must be a sequence, not a string"), "{err}");
        let list_of_numbers = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [73219]";
        refused(&[list_of_numbers], "providers.stripe.secrets", &["73219"]);
        let err = refused(
            &["[issuance]\ndefault_mode = \"s3cr3t-mode\""],
            "`issuance.default_mode`",
            &["s3cr3t-mode"],
        );
        assert!(err.contains("`upsert`, `atomic`"), "{err}");
        refused(
            &["[issuance]\nmax_quantity = 98765432109"],
            "`issuance.max_quantity`",
            &["98765432109"],
        );
        refused(
            &["[issuance]\nmax_quantity = -7654"],
            "`issuance.max_quantity`",
            &["7654"],
        );
        // A parser's own message is kept when it quotes nothing of the value...
        let err = refused(
            &["[server]\nbind = \"s3cr3t:host\""],
            "`server.bind`",
            &["s3cr3t"],
        );
        assert!(err.contains("invalid socket address syntax"), "{err}");
        // ...and dropped when it might.
        let value = Some(figment::value::Value::from("hunter2hunter2"));
        assert!(!quotes_no_value("bad value `hunter2hunt…`", value.clone()));
        assert!(!quotes_no_value(
            "bad value `hunter2hunter2`",
            value.clone()
        ));
        assert!(quotes_no_value("bad value", value));
        assert!(!quotes_no_value("bad value", None));
        let err = refused(&["[mongo]\nuri = 12345"], "`mongo.uri`", &["12345"]);
        assert!(err.contains("not an integer"), "{err}");
        // An unknown key is named (it is a key, not a value); its value is not.
        refused(
            &["[issuance]\nmax_quanity = \"hunter2-value\""],
            "`issuance.max_quanity`",
            &["hunter2-value"],
        );
        // A TOML syntax error: its position, never the line it quotes.
        let err = refused(
            &[&format!(
                "[providers.stripe]\nsecrets = [\"{SECRET_LIKE}\"\n"
            )],
            "TOML parse error at line",
            &[SECRET_LIKE, "Sup3r"],
        );
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn a_missing_key_is_named_once() {
        let err = Settings::from_figment(Figment::new(), "test".to_owned())
            .unwrap_err()
            .to_string();
        assert!(err.contains("`server` is required"), "{err}");
        let figment = Figment::new()
            .merge(Toml::string(DEFAULT_TOML))
            .merge(Toml::string("[providers.stripe]\nscheme = \"stripe\""));
        let err = Settings::from_figment(figment, "test".to_owned())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`providers.stripe.secrets` is required"),
            "{err}"
        );
    }

    #[test]
    fn provider_secrets_must_fit_their_scheme_and_are_never_echoed() {
        let stripe = |secret: &str| {
            format!(
                "[providers.billing]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\", \"{secret}\"]"
            )
        };
        Settings::with_overrides(&[&stripe("whsec_0123456789abcdefXYZ")]).expect("valid stripe");
        for secret in [
            "whsec_S3cretShort",
            "S3cretWithoutThePrefix0123",
            "whsec_S3cret with space!",
        ] {
            let err = refused(
                &[&stripe(secret)],
                "providers.billing.secrets[1]",
                &[secret, "S3cret"],
            );
            assert!(err.contains("provider `billing`"), "{err}");
        }
        let standard = |secret: &str| {
            format!("[providers.acme]\nscheme = \"standard-webhooks\"\nsecrets = [\"{secret}\"]")
        };
        Settings::with_overrides(&[&standard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")])
            .expect("valid standard-webhooks");
        let undecodable = "whsec_S3cret-not*base64!";
        let short = "whsec_S3cretAAAAAAAAAAAAAAAA"; // decodes to 21 bytes
        let long = format!("whsec_S3cret{}", "A".repeat(84)); // 72 bytes
        for secret in [
            undecodable,
            short,
            &long,
            "S3cretMfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa",
        ] {
            let err = refused(
                &[&standard(secret)],
                "providers.acme.secrets[0]",
                &[secret, "S3cret"],
            );
            assert!(err.contains("provider `acme`"), "{err}");
            assert!(err.contains("standard-webhooks"), "{err}");
        }
    }

    #[test]
    fn max_quantity_is_capped_to_what_one_write_carries() {
        let at_cap = format!("[issuance]\nmax_quantity = {MAX_QUANTITY}");
        let settings = Settings::with_overrides(&[&at_cap]).expect("the cap itself is allowed");
        assert_eq!(settings.issuance.max_quantity, 10_000);
        let over = format!("[issuance]\nmax_quantity = {}", MAX_QUANTITY + 1);
        let err = refused(&[&over], "`issuance.max_quantity`", &["10001"]);
        assert!(err.contains("at most 10000"), "{err}");
    }

    #[test]
    fn cors_origins_must_be_origins() {
        let origins = |list: &str| format!("[server]\ncors_origins = {list}");
        let settings = Settings::with_overrides(&[&origins(
            r#"["https://shop.example", "http://localhost:3000", "http://[::1]:8080"]"#,
        )])
        .expect("valid origins");
        assert_eq!(settings.server.cors_origins.len(), 3);
        for bad in [
            "*",
            "https://shop.example/",
            "https://shop.example/checkout",
            "shop.example",
            "ftp://shop.example",
            "https://Shop.example",
            "https://shop.example:443",
            "https://user@shop.example",
            "https://shop example",
            "",
        ] {
            let list = format!(r#"["https://ok.example", "{bad}"]"#);
            let err = refused(&[&origins(&list)], "`server.cors_origins[1]`", &[]);
            if !bad.is_empty() && bad != "*" {
                assert!(!err.contains(bad), "{bad:?} echoed in {err}");
            }
        }
    }

    #[test]
    fn unknown_scope_is_named_by_index() {
        let toml = format!(
            "[[auth.keys]]\nid = \"a\"\nsha256 = \"{}\"\nscopes = [\"read\", \"s3cr3t-scope\"]",
            "a".repeat(64)
        );
        refused(&[&toml], "auth.keys[0].scopes[1]", &["s3cr3t-scope"]);
    }

    #[test]
    fn empty_provider_secret_is_rejected() {
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(
            err.to_string().contains("providers.stripe.secrets"),
            "{err}"
        );
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\ntolerance_secs = 0";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("tolerance_secs"), "{err}");
    }
}
