//! The one `Settings` struct and how it is loaded.
//!
//! Layers, later ones winning: the defaults compiled into the binary
//! (`config/default.toml`), `config/<TOKENMINT_ENV>.toml` when present, the file given by
//! `--config` / `TOKENMINT_CONFIG`, then environment variables `TOKENMINT__SECTION__KEY`.
//! Unknown keys are rejected so that a typo in an operator's file is an error, not a
//! silently ignored setting; every validation error names the offending key.
//!
//! The sections are here, how a load error is told without echoing a value in
//! `errors`, the rules a loaded configuration must meet in `validate`, and what
//! production asks besides, per command, in `production`.

mod errors;
mod production;
mod secret_files;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use ipnet::IpNet;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::domain::{
    AccountGrant, AccountId, IssuanceMode, Provider, Scope, TokenPacks, TokenPrices,
};
pub use errors::SettingsError;
use errors::load_error;
#[cfg(test)]
pub(crate) use errors::tests::assert_refusal_names_only;

/// The defaults, compiled in so that the binary runs from any working directory.
const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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
    pub providers: BTreeMap<Provider, ProviderSettings>,
    pub webhooks: WebhookSettings,
    pub idempotency: IdempotencySettings,
    pub repair: RepairSettings,
    pub rate_limit: RateLimitSettings,
    pub log: LogSettings,
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// `TOKENMINT_ENV` (default `development`); not read from files.
    #[serde(skip)]
    pub environment: Environment,
}

/// Which deployment this is: `TOKENMINT_ENV`. Any lowercase name is accepted, as it also
/// picks the file `config/<name>.toml`; only `production` changes what a configuration
/// must meet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Environment {
    /// The default, when `TOKENMINT_ENV` is unset.
    #[default]
    Development,
    Production,
    /// Any other name (`test`, `staging`, …): development's rules.
    Named(String),
}

impl Environment {
    /// The name as `TOKENMINT_ENV` gives it (and `config/<name>.toml` is named).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Development => "development",
            Self::Production => "production",
            Self::Named(name) => name,
        }
    }
}

impl Environment {
    /// Reads `TOKENMINT_ENV`. A name is lowercase letters, digits, `_` and `-`, and one
    /// that looks like production but is not `production` is refused: `Production`,
    /// `production ` with a space a file left, a word of it (split at `-`, `_` and `.`)
    /// starting `prod` or `prd` or being `live` (`prod-eu`, `eu-prod`, `us-production`,
    /// `live-eu`), or a name within two edits of `production` (`producton`). Read as some
    /// other name it would start with development's rules — a random admin key printed,
    /// token prices and Basic credentials optional, test events accepted — where the
    /// operator meant production's.
    pub fn parse(name: &str) -> Result<Self, SettingsError> {
        let lowercase_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        let folded = name.trim().to_ascii_lowercase();
        let words: Vec<&str> = folded.split(['-', '_', '.', ' ']).collect();
        // `pre-prod`, `non-prod`: a word that says the next is not production.
        let looks_like_production = words.iter().enumerate().any(|(i, word)| {
            let negated = i > 0 && matches!(words[i - 1], "pre" | "non");
            !negated && (word.starts_with("prod") || word.starts_with("prd") || *word == "live")
        }) || strsim::levenshtein(&folded, "production") <= 2;
        match name {
            "development" => Ok(Self::Development),
            "production" => Ok(Self::Production),
            _ if looks_like_production => Err(errors::invalid(
                "TOKENMINT_ENV",
                format!(
                    "{name:?} looks like production but is not `production`, which alone has \
                     production's rules and is spelled so exactly (name a region's file with --config)"
                ),
            )),
            _ if !lowercase_name => Err(errors::invalid(
                "TOKENMINT_ENV",
                format!("{name:?} is not a name of lowercase letters, digits, `_` and `-`"),
            )),
            other => Ok(Self::Named(other.to_owned())),
        }
    }
}

/// A `_ms` key's whole number of milliseconds, as the `Duration` the code uses.
fn millis<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(Duration::from_millis)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on; port 0 picks a free port (the bound address is logged).
    pub bind: SocketAddr,
    #[serde(rename = "request_timeout_ms", deserialize_with = "millis")]
    pub request_timeout: Duration,
    pub body_limit_bytes: usize,
    pub cors_origins: Vec<String>,
    /// How long in-flight requests may run after SIGTERM before the server stops anyway.
    #[serde(rename = "shutdown_grace_ms", deserialize_with = "millis")]
    pub shutdown_grace: Duration,
    /// How long a client may take to send a request's headers; also how long an idle
    /// keep-alive connection stays open.
    #[serde(rename = "header_read_timeout_ms", deserialize_with = "millis")]
    pub header_read_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold at once, trusted proxies
    /// excepted; a new one beyond it is closed. 0: no such limit.
    pub max_connections_per_address: usize,
    /// When set, `/metrics` is served on this address only (e.g. a port the load
    /// balancer does not expose), and the public listener answers it 404.
    #[serde(default)]
    pub metrics_bind: Option<SocketAddr>,
    /// The proxies whose `X-Forwarded-For` names the client address (CIDRs, or single
    /// addresses); a request from any other peer is counted under the peer's address.
    #[serde(deserialize_with = "networks")]
    pub trusted_proxies: Vec<IpNet>,
    /// The runtime's worker threads; `None` (0 in the file): one per core, as tokio
    /// chooses. One by default: the service waits on MongoDB far more than it computes,
    /// and each wake-up handed between workers costs more CPU than a second worker gives
    /// back until one core is busy (docs/BENCHMARKS.md has the figures).
    #[serde(deserialize_with = "per_core_when_zero")]
    pub worker_threads: Option<NonZeroUsize>,
}

/// A thread count where 0 means "one per core" (`None`).
fn per_core_when_zero<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<NonZeroUsize>, D::Error> {
    usize::deserialize(deserializer).map(NonZeroUsize::new)
}

/// A list of networks, each a CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a single address
/// (its /32 or /128); an entry that is neither is refused naming its index, not its text
/// (the message must quote nothing an operator wrote, or `errors` drops it). Address bits
/// past the prefix are dropped (`10.1.2.3/16` is `10.1.0.0/16`). An entry wider than a
/// proxy network can be (an IPv4 prefix shorter than /8, an IPv6 one shorter than /16,
/// but for IPv6's private ranges, [`PRIVATE_IPV6`]) is refused: every client of a trusted
/// network names its own address, and takes a fresh allowance with each request, and
/// `0.0.0.0/1` with `128.0.0.0/1`, or the typo `10.1.2.3/1`, would trust the whole
/// Internet or half of it.
fn networks<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    let entries = Vec::<String>::deserialize(deserializer)?;
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let entry = entry.trim();
            let refused = |why: &str| serde::de::Error::custom(format!("entry {i} {why}"));
            let net = match entry.parse::<IpNet>() {
                Ok(net) => net.trunc(),
                Err(_) => entry.parse::<std::net::IpAddr>().map(IpNet::from).map_err(|_| {
                    refused("is not a CIDR (address/prefix length) nor an IP address")
                })?,
            };
            let net = ipv4_when_mapped(net);
            let narrowest_refused = match net {
                IpNet::V4(_) => 8,
                IpNet::V6(_) => 16,
            };
            let private = PRIVATE_IPV6.iter().any(|range| {
                range
                    .parse::<IpNet>()
                    .is_ok_and(|range| range.contains(&net))
            });
            if net.prefix_len() < narrowest_refused && !private {
                return Err(refused(&format!(
                    "trusts too wide a network (a prefix length under {narrowest_refused}): list the proxies' networks"
                )));
            }
            Ok(net)
        })
        .collect()
}

/// IPv6's ranges no packet from the Internet carries, trusted whole however wide (the
/// "private networks" of a proxy list, as `10.0.0.0/8` is in IPv4): unique local
/// addresses and link-local ones.
const PRIVATE_IPV6: [&str; 2] = ["fc00::/7", "fe80::/10"];

/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) as the IPv4 network it maps
/// (`10.0.0.0/8`): peers and forwarded hops are compared as IPv4 once unmapped, so the
/// mapped form would never match and everyone behind that proxy would share its address.
fn ipv4_when_mapped(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => v6
            .network()
            .to_ipv4_mapped()
            .and_then(|v4| ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).ok())
            .map_or(net, IpNet::V4),
        _ => net,
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MongoSettings {
    /// Empty: start the embedded mongod. A secret: it carries the database password, so
    /// no `Debug` of the settings prints it.
    pub uri: SecretString,
    /// A file holding `uri` (it carries the database password); read at load.
    #[serde(default)]
    pub uri_file: Option<PathBuf>,
    pub database: String,
    #[serde(rename = "server_selection_timeout_ms", deserialize_with = "millis")]
    pub server_selection_timeout: Duration,
    pub max_pool_size: u32,
    /// On a replica set of one member, the load (documents written a second)
    /// below which a cursor is kept waiting on the oplog; 0: never.
    pub oplog_waiter_below_per_second: u32,
    pub embedded: EmbeddedMongoSettings,
}

impl MongoSettings {
    /// The configured URI; `None`: the embedded mongod.
    pub fn configured_uri(&self) -> Option<&str> {
        Some(self.uri.expose_secret()).filter(|uri| !uri.is_empty())
    }
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
    /// wait`) on one instance; beyond it a request is answered at once. At most
    /// `server.max_connections` minus [`Settings::connection_reserve`].
    pub max_waiters: u32,
    /// Of those, the most one client address may hold (`ClientAddress`: IPv6 by /64).
    pub max_waiters_per_address: NonZeroU32,
    /// The most batches of one mode committed at once (2 to `MAX_BATCHES_IN_FLIGHT`).
    /// Above 2, the writers find by trying how many, from 2 to this, answer requests
    /// soonest; 2 keeps two, what answers soonest where mongod shares the service's cores.
    pub max_batches_in_flight: u32,
    /// What a token of each priced type costs, by currency (`[issuance.token_prices.<type>]`,
    /// `<CURRENCY> = <minor units per token>`): a provider event whose amount does not pay
    /// for the quantity its metadata names issues nothing. Empty: no type is priced.
    #[serde(default)]
    pub token_prices: TokenPrices,
}

/// The most `issuance.max_batches_in_flight` may be: each batch in flight holds a writer
/// task and pooled connections (two at once on its common path, more for replays and
/// slow paths), and a connection that is not free makes a command wait for one.
pub const MAX_BATCHES_IN_FLIGHT: u32 = 16;

/// Self-repair of token sets a crash left short.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairSettings {
    pub enabled: bool,
    /// How often each instance sweeps for unfinished issuances.
    #[serde(rename = "interval_ms", deserialize_with = "millis")]
    pub interval: Duration,
    /// How old an `issuing` record must be before it counts as abandoned: longer than
    /// any request may take, so a sweep does not race requests still in flight.
    #[serde(rename = "min_age_ms", deserialize_with = "millis")]
    pub min_age: Duration,
    /// How far back each sweep settles refunded or canceled payments again (covers an
    /// atomic issuance whose process died between its commit and its settle).
    #[serde(rename = "withdrawal_lookback_ms", deserialize_with = "millis")]
    pub withdrawal_lookback: Duration,
}

/// The retry policy of the `_version` gate when the client sent no `If-Match`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionGateSettings {
    #[serde(rename = "base_delay_ms", deserialize_with = "millis")]
    pub base_delay: Duration,
    #[serde(rename = "max_jitter_ms", deserialize_with = "millis")]
    pub max_jitter: Duration,
    pub max_attempts: u32,
    #[serde(rename = "budget_ms", deserialize_with = "millis")]
    pub budget: Duration,
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
    pub scopes: Vec<Scope>,
    /// When present, the key only sees these accounts.
    pub accounts: Option<Vec<AccountGrant>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    pub scheme: WebhookScheme,
    /// Several at once during rotation. From the environment or `secrets_file`, never a
    /// committed file.
    #[serde(default)]
    pub secrets: Vec<SecretString>,
    /// A file holding `secrets`, one per line; read at load.
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    #[serde(default = "default_tolerance")]
    pub tolerance_secs: u64,
    /// The HTTP Basic user name the provider sends with every delivery (scheme `adyen`
    /// only; required in production, with the password).
    #[serde(default)]
    pub basic_auth_username: Option<String>,
    /// Its password. From the environment or `basic_auth_password_file`, never a
    /// committed file.
    #[serde(default)]
    pub basic_auth_password: Option<SecretString>,
    /// A file holding `basic_auth_password`; read at load.
    #[serde(default)]
    pub basic_auth_password_file: Option<PathBuf>,
    /// Which mode's events count (schemes `stripe` and `adyen`, whose events say whether
    /// they are live): `true` live ones only, `false` test ones only; the other mode's
    /// are ignored. Unset, both count — except in production, where loading fills in
    /// `true` (`Settings::resolve`): a test payment must never mint real tokens.
    #[serde(default)]
    pub livemode: Option<bool>,
    /// When an Adyen payment is paid (scheme `adyen` only; unset is `auto`).
    #[serde(default)]
    pub capture: Option<Capture>,
    /// The accounts whose payments may issue: `default` stands for the provider's own
    /// (events that name no account). Unset, every account's; withdrawals count
    /// whatever the account. One secret may sign many accounts'
    /// events alike (a Stripe Connect endpoint signs every connected account's), and an
    /// account's holder can make payments there at will: this says whose payments issue.
    #[serde(default)]
    pub accounts: Option<Vec<AccountId>>,
    /// The tokens each of the provider's prices sells (scheme `paddle` only,
    /// `[providers.<name>.token_packs.<price id>]`): where any is configured, a
    /// transaction issues no more than its items bought.
    #[serde(default)]
    pub token_packs: TokenPacks,
}

/// How an Adyen merchant account captures its payments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capture {
    /// Captured with the authorisation: `AUTHORISATION` is the success.
    #[default]
    Auto,
    /// Captured later by the merchant: `AUTHORISATION` is processing, `CAPTURE` the
    /// success.
    Manual,
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

impl WebhookScheme {
    /// Whether the scheme's events say if they are live or test (`livemode`).
    pub fn marks_livemode(self) -> bool {
        matches!(self, Self::Stripe | Self::Adyen)
    }

    /// Whether the customer may have written its events' token metadata (Paddle's
    /// `custom_data`, which Paddle.js sets in the browser) rather than the merchant.
    pub fn customer_writes_metadata(self) -> bool {
        matches!(self, Self::Paddle)
    }
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

/// The longest `webhooks.retention_days`: the dedupe records' TTL index holds it in
/// seconds, and MongoDB refuses a TTL above 2^31 - 1 seconds (some 68 years). Refused at
/// load, naming the key, rather than by the index build at start.
pub const MAX_RETENTION_DAYS: u32 = i32::MAX as u32 / 86_400;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    pub retention_days: u32,
    /// The largest body `POST /v1/webhooks/{provider}` reads, apart from
    /// `server.body_limit_bytes`: a provider's event is not a client's request (a
    /// Stripe dispute carries its evidence text, up to 150,000 characters), and one
    /// refused 413 is refused on every redelivery, its money never applied.
    pub body_limit_bytes: usize,
}

/// `Idempotency-Key`s of token actions and redemptions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    /// How long a key and its answer are kept (`retention_hours`, at least 1).
    #[serde(rename = "retention_hours", deserialize_with = "hours")]
    pub retention: Duration,
}

/// A whole number of hours, as a `Duration`; 0 is refused here, naming the key.
fn hours<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let hours = u64::deserialize(deserializer)?;
    if hours == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(Duration::from_secs(hours.saturating_mul(3600)))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    pub per_key_per_second: u32,
    pub burst: u32,
    /// The allowance of one client address of a checkout key (a key holding only
    /// `issuances:request`), instead of the key's own: anyone can copy a checkout key.
    pub per_address_per_second: NonZeroU32,
    pub per_address_burst: NonZeroU32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

/// Traces.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The OpenTelemetry collector's OTLP/HTTP base URL; unset or empty: no traces.
    #[serde(default, deserialize_with = "otlp_endpoint")]
    pub otlp_endpoint: Option<OtlpEndpoint>,
    /// Each MongoDB command's latency as a histogram. Off by default: the driver then
    /// copies every command document into an event.
    #[serde(default)]
    pub mongodb_command_metrics: bool,
}

/// An OTLP/HTTP collector's base URL: `http://host[:port][/path]`. Plain HTTP only —
/// the exporter carries no TLS stack; a collector beside the service (a sidecar, a
/// node agent) is the usual way, and it forwards over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint(String);

impl OtlpEndpoint {
    /// Where spans are posted: the base URL with `/v1/traces`, as the OTLP spec says.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.0.trim_end_matches('/'))
    }
}

fn otlp_endpoint<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<OtlpEndpoint>, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.is_empty() {
        return Ok(None);
    }
    let uri: axum::http::Uri = text
        .parse()
        .map_err(|_| serde::de::Error::custom("must be a URL such as http://collector:4318"))?;
    match (uri.scheme_str(), uri.authority(), uri.query()) {
        (Some("http"), Some(_), None) => Ok(Some(OtlpEndpoint(text))),
        (Some("https"), ..) => Err(serde::de::Error::custom(
            "must be plain http:// (send to a local collector, which forwards over TLS)",
        )),
        _ => Err(serde::de::Error::custom(
            "must be a URL such as http://collector:4318, without a query",
        )),
    }
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

/// The prefix of configuration environment variables.
const ENV_PREFIX: &str = "TOKENMINT__";

impl Settings {
    /// Loads the layered configuration from the process environment.
    pub fn load(config_file: Option<&Path>) -> Result<Self, SettingsError> {
        let (figment, environment) = Self::layers(config_file)?;
        Self::from_figment(figment, environment)
    }

    /// `server.bind` alone, from the layers `load` reads: all `healthcheck` needs. A
    /// container's check runs without the flags and files `serve` was given (a provider's
    /// scheme in `serve`'s `--config`, its secret in the environment), so the rest of the
    /// configuration, whole only for `serve`, must not fail it.
    pub fn load_bind(config_file: Option<&Path>) -> Result<SocketAddr, SettingsError> {
        let (figment, _) = Self::layers(config_file)?;
        figment
            .extract_inner("server.bind")
            .map_err(|error| load_error(&figment, error))
    }

    /// Every layer, environment variables last, and the environment they were read for.
    fn layers(config_file: Option<&Path>) -> Result<(Figment, Environment), SettingsError> {
        let environment = match std::env::var("TOKENMINT_ENV") {
            Ok(name) => Environment::parse(&name)?,
            Err(_) => Environment::Development,
        };
        let figment = Self::figment(&environment, config_file).merge(
            Env::prefixed(ENV_PREFIX)
                .split("__")
                .map(|key| key.as_str().to_ascii_lowercase().into()),
        );
        Ok((figment, environment))
    }

    /// Defaults + environment file + `--config` file, without environment variables.
    fn figment(environment: &Environment, config_file: Option<&Path>) -> Figment {
        let mut figment = Figment::new().merge(Toml::string(DEFAULT_TOML));
        let env_file = PathBuf::from(format!("config/{}.toml", environment.as_str()));
        if env_file.is_file() {
            figment = figment.merge(Toml::file(env_file));
        }
        if let Some(file) = config_file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment
    }

    /// Extracts and validates; used by `load` and by tests that build settings in code.
    pub fn from_figment(figment: Figment, environment: Environment) -> Result<Self, SettingsError> {
        let mut settings: Settings = figment
            .extract()
            .map_err(|error| load_error(&figment, error))?;
        settings.environment = environment;
        settings.read_secret_files()?;
        settings.validate()?;
        settings.resolve();
        Ok(settings)
    }

    /// Fills in what an unset setting means in this environment, once, after validation:
    /// in production a provider whose events mark their mode accepts live ones only.
    fn resolve(&mut self) {
        let production = self.is_production();
        for provider in self.providers.values_mut() {
            if production && provider.scheme.marks_livemode() {
                provider.livemode.get_or_insert(true);
            }
        }
    }

    /// The compiled-in defaults with `layers` (TOML texts, later ones winning) on top;
    /// for tests and tools.
    pub fn with_overrides(layers: &[&str]) -> Result<Self, SettingsError> {
        let figment = layers.iter().fold(
            Figment::new().merge(Toml::string(DEFAULT_TOML)),
            |figment, layer| figment.merge(Toml::string(layer)),
        );
        Self::from_figment(figment, Environment::Named("test".to_owned()))
    }

    pub fn is_production(&self) -> bool {
        self.environment == Environment::Production
    }

    /// `server.request_timeout_ms`.
    pub fn request_timeout(&self) -> Duration {
        self.server.request_timeout
    }

    /// `mongo.server_selection_timeout_ms`.
    pub fn server_selection_timeout(&self) -> Duration {
        self.mongo.server_selection_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let settings = Settings::with_overrides(&[""]).expect("defaults load");
        assert_eq!(settings.issuance.max_quantity, 1000);
        assert_eq!(settings.issuance.max_waiters, 768);
        assert_eq!(settings.issuance.max_waiters_per_address.get(), 8);
        assert_eq!(settings.issuance.max_batches_in_flight, 2);
        assert_eq!(settings.rate_limit.per_address_per_second.get(), 20);
        assert_eq!(settings.rate_limit.per_address_burst.get(), 40);
        assert!(settings.server.trusted_proxies.is_empty());
        assert_eq!(settings.issuance.default_mode, IssuanceMode::Upsert);
        assert_eq!(
            settings.idempotency.retention,
            Duration::from_secs(24 * 3600)
        );
    }

    #[test]
    fn worker_threads_are_one_by_default_and_zero_means_one_per_core() {
        let defaults = Settings::with_overrides(&[""]).unwrap();
        assert_eq!(defaults.server.worker_threads, NonZeroUsize::new(1));
        let per_core = Settings::with_overrides(&["[server]\nworker_threads = 0"]).unwrap();
        assert_eq!(per_core.server.worker_threads, None);
        let four = Settings::with_overrides(&["[server]\nworker_threads = 4"]).unwrap();
        assert_eq!(four.server.worker_threads, NonZeroUsize::new(4));
        let err = Settings::with_overrides(&["[server]\nworker_threads = -1"]).unwrap_err();
        assert!(err.to_string().contains("worker_threads"), "{err}");
    }

    #[test]
    fn idempotency_retention_is_whole_positive_hours() {
        let err = Settings::with_overrides(&["[idempotency]\nretention_hours = 0"]).unwrap_err();
        assert!(err.to_string().contains("retention_hours"), "{err}");
        let err = Settings::with_overrides(&["[idempotency]\nretention_hours = 1.5"]).unwrap_err();
        assert!(err.to_string().contains("retention_hours"), "{err}");
        let settings = Settings::with_overrides(&["[idempotency]\nretention_hours = 48"]).unwrap();
        assert_eq!(
            settings.idempotency.retention,
            Duration::from_secs(48 * 3600)
        );
    }

    #[test]
    fn an_environment_is_a_lowercase_name_and_production_is_spelled_exactly() {
        assert_eq!(
            Environment::parse("production").unwrap(),
            Environment::Production
        );
        assert_eq!(
            Environment::parse("development").unwrap(),
            Environment::Development
        );
        assert_eq!(
            Environment::parse("staging-2").unwrap(),
            Environment::Named("staging-2".to_owned())
        );
        // Words that merely contain the letters, or say it is not production, are other
        // names.
        for other in [
            "delivery",
            "test",
            "reproduce",
            "pre-prod",
            "non-prod",
            "pre-production",
            "preprod",
        ] {
            assert!(Environment::parse(other).is_ok(), "{other}");
        }
        for near in [
            "Production",
            "PRODUCTION",
            "production ",
            " production",
            "prod",
            "prod-eu",
            "production-eu",
            "producton",
            "prodution",
            "prd",
            "live",
            "eu-prod",
            "us-production",
            "live-eu",
            "eu_live",
        ] {
            let refused = Environment::parse(near).unwrap_err().to_string();
            assert!(refused.contains("`TOKENMINT_ENV`"), "{near:?}: {refused}");
            assert!(
                refused.contains("spelled so exactly"),
                "{near:?}: {refused}"
            );
        }
        for bad in ["", "Staging", "staging ", "a/b", "x.y"] {
            let refused = Environment::parse(bad).unwrap_err().to_string();
            assert!(refused.contains("lowercase letters"), "{bad:?}: {refused}");
        }
    }

    #[test]
    fn production_without_livemode_means_live_only() {
        let provider = |livemode: &str| {
            format!(
                "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdefghij\"]\n{livemode}"
            )
        };
        let load = |environment: &str, livemode: &str| {
            let figment = Figment::new()
                .merge(Toml::string(DEFAULT_TOML))
                .merge(Toml::string(&provider(livemode)));
            Settings::from_figment(figment, Environment::parse(environment).unwrap())
                .unwrap()
                .providers["stripe"]
                .livemode
        };
        assert_eq!(load("production", ""), Some(true));
        assert_eq!(load("production", "livemode = false"), Some(false));
        assert_eq!(
            load("development", ""),
            None,
            "both modes outside production"
        );
        assert_eq!(load("development", "livemode = true"), Some(true));
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Settings::with_overrides(&["[issuance]\nmax_quanity = 3"]).unwrap_err();
        assert!(err.to_string().contains("max_quanity"), "{err}");
    }
}
