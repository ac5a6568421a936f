//! What a loaded configuration must meet before anything starts: each rule names the key
//! it refuses, and never the value.

use super::errors::invalid;
use super::{
    MAX_BATCHES_IN_FLIGHT, MAX_QUANTITY, MAX_RETENTION_DAYS, ProviderSettings, Settings,
    SettingsError, WebhookScheme,
};
use crate::domain::Provider;

/// The fewest connections kept from waiting checkouts, however small
/// `server.max_connections` is: a few webhooks, a trusted backend and the probes.
pub const MIN_CONNECTION_RESERVE: usize = 16;

impl Settings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        let positive_durations = [
            ("server.request_timeout_ms", self.server.request_timeout),
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout,
            ),
            (
                "mongo.server_selection_timeout_ms",
                self.mongo.server_selection_timeout,
            ),
            ("version_gate.budget_ms", self.version_gate.budget),
            ("repair.interval_ms", self.repair.interval),
            // 0 would abandon every request in flight at SIGTERM, which shutdown promises
            // to finish.
            ("server.shutdown_grace_ms", self.server.shutdown_grace),
        ];
        for (key, duration) in positive_durations {
            if duration.is_zero() {
                return Err(invalid(key, "must be greater than 0"));
            }
        }
        let positive = [
            ("server.max_connections", self.server.max_connections as u64),
            (
                "server.body_limit_bytes",
                self.server.body_limit_bytes as u64,
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
            (
                "webhooks.retention_days",
                u64::from(self.webhooks.retention_days),
            ),
            (
                "webhooks.body_limit_bytes",
                self.webhooks.body_limit_bytes as u64,
            ),
            (
                "issuance.pending_ttl_days",
                u64::from(self.issuance.pending_ttl_days),
            ),
            ("issuance.max_waiters", u64::from(self.issuance.max_waiters)),
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
        // A refund that raced an atomic issuance happened at most one request before the
        // commit, and the next sweep of a surviving instance runs at most one interval
        // after it: a shorter window (0 disables it) lets that sweep miss the refund.
        let lookback_floor = self
            .repair
            .interval
            .saturating_add(self.server.request_timeout);
        if self.repair.withdrawal_lookback < lookback_floor {
            return Err(invalid(
                "repair.withdrawal_lookback_ms",
                "must be at least repair.interval_ms + server.request_timeout_ms (a sweep must \
                 still see a refund that raced an issuance)",
            ));
        }
        if self.webhooks.retention_days > MAX_RETENTION_DAYS {
            return Err(invalid(
                "webhooks.retention_days",
                format!(
                    "must be at most {MAX_RETENTION_DAYS}: MongoDB keeps a TTL index of at most \
                     2^31 - 1 seconds"
                ),
            ));
        }
        if !(2..=MAX_BATCHES_IN_FLIGHT).contains(&self.issuance.max_batches_in_flight) {
            return Err(invalid(
                "issuance.max_batches_in_flight",
                format!("must be from 2 to {MAX_BATCHES_IN_FLIGHT}"),
            ));
        }
        if self.issuance.max_quantity > MAX_QUANTITY {
            return Err(invalid(
                "issuance.max_quantity",
                format!(
                    "must be at most {MAX_QUANTITY} (the tokens of one issuance are written in one command)"
                ),
            ));
        }
        self.validate_waiters()?;
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

    /// Waiting checkouts hold connections, and public keys can make as many as they
    /// like: however many wait, a reserve of `server.max_connections` stays for
    /// webhooks, trusted keys and probes. Refused, not derived: an operator who raised
    /// one setting without the other hears of it at the start, not under load.
    fn validate_waiters(&self) -> Result<(), SettingsError> {
        let connections = self.server.max_connections;
        let reserve = Self::connection_reserve(connections);
        let waiters = self.issuance.max_waiters as usize;
        if waiters.saturating_add(reserve) > connections {
            return Err(invalid(
                "issuance.max_waiters",
                format!(
                    "must leave {reserve} of server.max_connections ({connections}) for webhooks, \
                     trusted keys and probes: at most {}",
                    connections.saturating_sub(reserve)
                ),
            ));
        }
        Ok(())
    }

    /// The connections waiting checkouts may never take: a quarter of `max_connections`,
    /// and at least [`MIN_CONNECTION_RESERVE`].
    pub fn connection_reserve(max_connections: usize) -> usize {
        (max_connections / 4).max(MIN_CONNECTION_RESERVE)
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
            // An empty list would let the key see nothing, so every request it makes would
            // be refused or find nothing, and nothing at start would say why.
            if key.accounts.as_ref().is_some_and(Vec::is_empty) {
                return Err(invalid(
                    format!("{at}.accounts"),
                    "must list at least one account (leave it out for every account)",
                ));
            }
        }
        self.refuse_duplicate_keys()
    }

    /// Two entries with one id would share a rate-limit bucket and an audit name; two with
    /// one hash are one key whose scopes depend on which entry matches first. Neither is
    /// what the operator meant, so both are refused, naming the two entries (not the
    /// values: a hash identifies a key).
    fn refuse_duplicate_keys(&self) -> Result<(), SettingsError> {
        let keys = &self.auth.keys;
        for (i, key) in keys.iter().enumerate() {
            for (first, earlier) in keys[..i].iter().enumerate() {
                if earlier.id == key.id {
                    return Err(invalid(
                        format!("auth.keys[{i}].id"),
                        format!("repeats `auth.keys[{first}].id`: every key needs its own id"),
                    ));
                }
                if earlier.sha256.eq_ignore_ascii_case(&key.sha256) {
                    return Err(invalid(
                        format!("auth.keys[{i}].sha256"),
                        format!(
                            "repeats `auth.keys[{first}].sha256`: one key, one entry (give it every scope it needs there)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_providers(&self) -> Result<(), SettingsError> {
        for (name, provider) in &self.providers {
            let at = format!("providers.{name}");
            if provider.secrets.is_empty() {
                return Err(invalid(
                    format!("{at}.secrets"),
                    "must hold at least one secret (or name a file of them in `secrets_file`)",
                ));
            }
            // Each secret's shape is its scheme's rule, checked where the providers are
            // built (`webhooks::Providers::from_settings`).
            if provider.tolerance_secs == 0 {
                return Err(invalid(
                    format!("{at}.tolerance_secs"),
                    "must be greater than 0",
                ));
            }
            // The timestamp window and the dedupe record together refuse a replay: a
            // delivery still inside its window once its record expired would be new again.
            let retention_secs = u64::from(self.webhooks.retention_days) * 86_400;
            if provider.tolerance_secs >= retention_secs {
                return Err(invalid(
                    format!("{at}.tolerance_secs"),
                    format!(
                        "must be shorter than `webhooks.retention_days` ({retention_secs} s): a delivery replayed after its dedupe record expired would still be inside its window"
                    ),
                ));
            }
            self.validate_basic_auth(name, provider)?;
            let whose = format!("(provider `{name}`, scheme `{}`)", provider.scheme);
            if provider.livemode.is_some() && !provider.scheme.marks_livemode() {
                return Err(invalid(
                    format!("{at}.livemode"),
                    format!(
                        "{whose} is only for schemes `stripe` and `adyen`, whose events say whether they are live"
                    ),
                ));
            }
            self.validate_accounts(name, provider)?;
            if provider.capture.is_some() && provider.scheme != WebhookScheme::Adyen {
                return Err(invalid(
                    format!("{at}.capture"),
                    format!("{whose} is only for scheme `adyen`"),
                ));
            }
            if !provider.token_packs.is_empty() && provider.scheme != WebhookScheme::Paddle {
                return Err(invalid(
                    format!("{at}.token_packs"),
                    format!("{whose} is only for scheme `paddle`"),
                ));
            }
            // Metadata the customer may have written names only priced types where any
            // price is configured: a pack of another would never issue.
            let prices = &self.issuance.token_prices;
            if let Some(unpriced) = provider
                .token_packs
                .token_types()
                .find(|token_type| !prices.is_empty() && !prices.has_price(token_type))
            {
                return Err(invalid(
                    format!("{at}.token_packs"),
                    format!(
                        "{whose} sells tokens of type `{unpriced}`, which has no price in `issuance.token_prices`: a transaction naming them would never issue"
                    ),
                ));
            }
            // Paddle's `custom_data` is also written by Paddle.js in the customer's
            // browser: in production the quantity it names must be paid for. Packs alone
            // would not do: they count the items, not what was charged for them (a
            // trial, a discount).
            if provider.scheme == WebhookScheme::Paddle
                && self.is_production()
                && self.issuance.token_prices.is_empty()
            {
                return Err(invalid(
                    "issuance.token_prices".to_owned(),
                    format!(
                        "is required in production (TOKENMINT_ENV=production) with a provider of scheme `paddle` ({whose}): a customer can set a checkout's custom_data in the browser, so each token type it issues needs a price its payment must cover"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A provider's `accounts`: a list that could let no event issue is refused, since
    /// nothing at start would say why every success is ignored. Empty; on Paddle, whose
    /// events all have the one account `default` (nothing to choose); holding `default`
    /// on Adyen, whose items always name their merchant account.
    fn validate_accounts(
        &self,
        name: &Provider,
        provider: &ProviderSettings,
    ) -> Result<(), SettingsError> {
        let Some(accounts) = &provider.accounts else {
            return Ok(());
        };
        let key = format!("providers.{name}.accounts");
        let whose = format!("(provider `{name}`, scheme `{}`)", provider.scheme);
        if accounts.is_empty() {
            return Err(invalid(
                key,
                "must list at least one account (`default` for the provider's own; leave it out for every account)",
            ));
        }
        if provider.scheme == WebhookScheme::Paddle {
            return Err(invalid(
                key,
                format!(
                    "{whose} is not for scheme `paddle`, whose events all have the one account `default`"
                ),
            ));
        }
        if provider.scheme == WebhookScheme::Adyen
            && accounts.iter().any(|a| a.as_str() == "default")
        {
            return Err(invalid(
                key,
                format!(
                    "{whose} lists `default`, which no Adyen item has: each names its merchant account (`merchantAccountCode`)"
                ),
            ));
        }
        Ok(())
    }

    /// A provider's HTTP Basic credentials: a pair, for scheme `adyen` only, and required
    /// there in production — Adyen signs neither an item's date nor its metadata, so a
    /// captured item must not be enough to replay it changed.
    fn validate_basic_auth(
        &self,
        name: &Provider,
        provider: &ProviderSettings,
    ) -> Result<(), SettingsError> {
        use secrecy::ExposeSecret;
        let username = format!("providers.{name}.basic_auth_username");
        let password = format!("providers.{name}.basic_auth_password");
        let scheme = provider.scheme;
        let whose = format!("(provider `{name}`, scheme `{scheme}`)");
        let adyen = scheme == WebhookScheme::Adyen;
        match (&provider.basic_auth_username, &provider.basic_auth_password) {
            (None, None) if adyen && self.is_production() => Err(invalid(
                username,
                format!(
                    "{whose} is required in production (TOKENMINT_ENV=production), with \
                     `basic_auth_password`: the webhook's Basic credentials from the \
                     Customer Area, the password from the environment"
                ),
            )),
            (None, None) => Ok(()),
            (Some(_), _) if !adyen => Err(invalid(
                username,
                format!("{whose} is only for scheme `adyen`"),
            )),
            (_, Some(_)) if !adyen => Err(invalid(
                password,
                format!("{whose} is only for scheme `adyen`"),
            )),
            (Some(_), None) => Err(invalid(
                password,
                format!("{whose} is required with `basic_auth_username`"),
            )),
            (None, Some(_)) => Err(invalid(
                username,
                format!("{whose} is required with `basic_auth_password`"),
            )),
            (Some(user), Some(secret)) => {
                if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                    return Err(invalid(
                        username,
                        format!("{whose} must be a user name without `:` or control characters"),
                    ));
                }
                if secret.expose_secret().is_empty() {
                    return Err(invalid(password, format!("{whose} must not be empty")));
                }
                Ok(())
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AccountId;
    use crate::settings::errors::tests::refused;

    #[test]
    fn a_repeated_key_id_or_hash_is_refused_naming_both_entries() {
        let entry = |id: &str, hash: &str| {
            format!("[[auth.keys]]\nid = \"{id}\"\nsha256 = \"{hash}\"\nscopes = [\"read\"]\n")
        };
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let toml = format!("{}{}", entry("web", &a), entry("web", &b));
        let err = Settings::with_overrides(&[&toml]).unwrap_err().to_string();
        assert!(
            err.contains("`auth.keys[1].id` repeats `auth.keys[0].id`"),
            "{err}"
        );

        // The same hash in another case is the same key.
        let toml = format!(
            "{}{}",
            entry("web", &a),
            entry("backend", &a.to_uppercase())
        );
        let err = Settings::with_overrides(&[&toml]).unwrap_err().to_string();
        assert!(
            err.contains("`auth.keys[1].sha256` repeats `auth.keys[0].sha256`"),
            "{err}"
        );
        assert!(!err.contains(&a), "the hash is not printed: {err}");

        let toml = format!("{}{}", entry("web", &a), entry("backend", &b));
        Settings::with_overrides(&[&toml]).expect("distinct keys are fine");
    }

    #[test]
    fn zero_values_name_their_key() {
        let err = Settings::with_overrides(&["[issuance]\nmax_quantity = 0"]).unwrap_err();
        assert!(err.to_string().contains("issuance.max_quantity"), "{err}");
        let err = Settings::with_overrides(&["[issuance]\nmax_waiters = 0"]).unwrap_err();
        assert!(err.to_string().contains("issuance.max_waiters"), "{err}");
        let err = Settings::with_overrides(&["[server]\nshutdown_grace_ms = 0"]).unwrap_err();
        assert!(
            err.to_string().contains("server.shutdown_grace_ms"),
            "{err}"
        );
    }

    #[test]
    fn waiters_always_leave_a_reserve_of_connections() {
        let limits = |connections: usize, waiters: usize, per_address: u32| {
            format!(
                "[server]\nmax_connections = {connections}\n[issuance]\nmax_waiters = {waiters}\nmax_waiters_per_address = {per_address}"
            )
        };
        let settings =
            Settings::with_overrides(&[&limits(1024, 768, 8)]).expect("the reserve exactly");
        assert_eq!(settings.issuance.max_waiters, 768);
        let err = refused(&[&limits(1024, 769, 8)], "`issuance.max_waiters`", &["769"]);
        assert!(
            err.contains("must leave 256 of server.max_connections (1024)")
                && err.contains("at most 768"),
            "{err}"
        );
        // Small caps keep at least MIN_CONNECTION_RESERVE.
        Settings::with_overrides(&[&limits(20, 4, 1)]).expect("4 + 16 = 20");
        refused(&[&limits(20, 5, 1)], "at most 4", &[]);
        refused(&[&limits(16, 1, 1)], "`issuance.max_waiters`", &[]);
        // A share above the total is the total: one address may then hold every place.
        Settings::with_overrides(&[&limits(1024, 4, 8)]).expect("the total bounds it anyway");
        refused(
            &[&limits(1024, 4, 0)],
            "`issuance.max_waiters_per_address`",
            &[],
        );
    }

    #[test]
    fn the_mongo_uri_is_a_secret_no_debug_prints() {
        let settings = Settings::with_overrides(&[
            "[mongo]\nuri = \"mongodb://app:S3cretPassw0rd@db.internal:27017/?replicaSet=rs\"",
        ])
        .unwrap();
        assert_eq!(
            settings.mongo.configured_uri(),
            Some("mongodb://app:S3cretPassw0rd@db.internal:27017/?replicaSet=rs")
        );
        assert!(!format!("{settings:?}").contains("S3cret"));
    }

    #[test]
    fn trusted_proxies_are_networks_named_by_index() {
        let proxies = |list: &str| format!("[server]\ntrusted_proxies = {list}");
        let settings = Settings::with_overrides(&[&proxies(
            r#"["10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "10.1.2.3/16", "::ffff:172.16.0.0/108", "::ffff:192.0.2.9"]"#,
        )])
        .expect("CIDRs and single addresses");
        let nets: Vec<String> = settings
            .server
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            nets,
            [
                "10.0.0.0/8",
                "192.0.2.7/32",
                "2001:db8::/32",
                "10.1.0.0/16",
                "172.16.0.0/12",
                "192.0.2.9/32"
            ],
            "host bits dropped, addresses as one-host networks, IPv4-mapped ones as IPv4"
        );
        for bad in [
            "10.0.0.0/33",
            "proxy.internal",
            "10.0.0.1.5",
            "S3cretProxyName/8",
        ] {
            let list = format!(r#"["10.0.0.0/8", "{bad}"]"#);
            let err = refused(&[&proxies(&list)], "`server.trusted_proxies`", &[]);
            assert!(err.contains("entry 1 is not a CIDR"), "{err}");
            assert!(!err.contains(bad), "{bad:?} echoed in {err}");
        }
        for (too_wide, shortest) in [
            (r#"["0.0.0.0/0"]"#, 8),
            (r#"["::/0"]"#, 16),
            (r#"["10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1"]"#, 8),
            (r#"["10.1.2.3/1"]"#, 8),
            (r#"["10.0.0.0/7"]"#, 8),
            (r#"["2001:db8::/15"]"#, 16),
            (r#"["::ffff:10.0.0.0/103"]"#, 8),
            (r#"["fc00::/6"]"#, 16),
            (r#"["fe80::/9"]"#, 16),
        ] {
            let err = refused(&[&proxies(too_wide)], "`server.trusted_proxies`", &[]);
            assert!(
                err.contains(&format!(
                    "trusts too wide a network (a prefix length under {shortest})"
                )),
                "{too_wide}: {err}"
            );
        }
        for narrowest_allowed in [
            r#"["10.0.0.0/8"]"#,
            r#"["2001::/16"]"#,
            r#"["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fd00::/8", "fe80::/10"]"#,
        ] {
            Settings::with_overrides(&[&proxies(narrowest_allowed)]).expect(narrowest_allowed);
        }
    }

    #[test]
    fn the_withdrawal_lookback_covers_a_sweep_interval_and_a_request() {
        for lookback in [0, 39_999] {
            let toml = format!(
                "[server]\nrequest_timeout_ms = 30000\n[repair]\ninterval_ms = 10000\nwithdrawal_lookback_ms = {lookback}"
            );
            let err = refused(&[&toml], "`repair.withdrawal_lookback_ms`", &["39999"]);
            assert!(
                err.contains("at least repair.interval_ms + server.request_timeout_ms"),
                "{err}"
            );
        }
        let toml = "[server]\nrequest_timeout_ms = 30000\n[repair]\ninterval_ms = 10000\nwithdrawal_lookback_ms = 40000";
        let settings = Settings::with_overrides(&[toml]).expect("exactly the minimum");
        assert_eq!(
            settings.repair.withdrawal_lookback,
            std::time::Duration::from_secs(40)
        );
    }

    #[test]
    fn bad_key_hash_is_named() {
        let toml = "[[auth.keys]]\nid = \"a\"\nsha256 = \"zz\"\nscopes = [\"admin\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("auth.keys[0].sha256"), "{err}");
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
        let err = refused(&[&toml], "`auth.keys[0].scopes[1]`", &["s3cr3t-scope"]);
        assert!(
            err.contains("`issuances:write`, `issuances:request`, `read`"),
            "{err}"
        );
    }

    #[test]
    fn a_provider_name_outside_the_alphabet_is_named() {
        let toml =
            "[providers.S3cret_Name]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]";
        let err = Settings::with_overrides(&[toml]).unwrap_err().to_string();
        assert!(err.contains("`providers.S3cret_Name`"), "{err}");
        assert!(err.contains("a provider name matching"), "{err}");
    }

    #[test]
    fn an_account_entry_must_be_an_account_or_provider_slash_account() {
        let key = |accounts: &str| {
            format!(
                "[[auth.keys]]\nid = \"a\"\nsha256 = \"{}\"\nscopes = [\"read\"]\naccounts = {accounts}",
                "a".repeat(64)
            )
        };
        Settings::with_overrides(&[&key(r#"["acct_1", "stripe/acct_2"]"#)]).expect("both forms");
        let err = refused(
            &[&key(r#"["acct_1", "S3cret/acct_2"]"#)],
            "`auth.keys[0].accounts[1]`",
            &["S3cret"],
        );
        assert!(err.contains("provider/account"), "{err}");
    }

    #[test]
    fn a_providers_accounts_are_account_ids_and_at_least_one() {
        let stripe = |accounts: &str| {
            format!(
                "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_1\"]\naccounts = {accounts}"
            )
        };
        let settings =
            Settings::with_overrides(&[&stripe(r#"["default", "acct_1"]"#)]).expect("accounts");
        let accounts = settings.providers.values().next().unwrap().accounts.clone();
        assert_eq!(
            accounts,
            Some(vec![
                AccountId::parse("default").unwrap(),
                AccountId::parse("acct_1").unwrap()
            ])
        );
        let err = refused(
            &[&stripe(r#"["acct 1"]"#)],
            "`providers.stripe.accounts[0]`",
            &["acct 1"],
        );
        assert!(err.contains(AccountId::RULE), "{err}");
        let err = Settings::with_overrides(&[&stripe("[]")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("providers.stripe.accounts"), "{err}");
        // Lists that would let nothing issue: Paddle's events all have `default`, and
        // no Adyen item has it.
        let paddle = "[providers.paddle]\nscheme = \"paddle\"\nsecrets = [\"pdl_ntfset_1\"]\naccounts = [\"default\"]";
        let err = Settings::with_overrides(&[paddle]).unwrap_err().to_string();
        assert!(err.contains("providers.paddle.accounts"), "{err}");
        let adyen = format!(
            "[providers.adyen]\nscheme = \"adyen\"\nsecrets = [\"{}\"]\naccounts = [\"default\"]",
            "AB".repeat(32)
        );
        let err = Settings::with_overrides(&[&adyen]).unwrap_err().to_string();
        assert!(err.contains("providers.adyen.accounts"), "{err}");
        assert!(err.contains("merchantAccountCode"), "{err}");
    }

    #[test]
    fn an_empty_account_list_is_refused() {
        let key = format!(
            "[[auth.keys]]\nid = \"a\"\nsha256 = \"{}\"\nscopes = [\"read\"]\naccounts = []",
            "a".repeat(64)
        );
        let err = Settings::with_overrides(&[&key]).unwrap_err().to_string();
        assert!(err.contains("auth.keys[0].accounts"), "{err}");
    }

    #[test]
    fn a_retention_longer_than_a_ttl_index_holds_is_refused() {
        let retention = |days: u32| format!("[webhooks]\nretention_days = {days}");
        Settings::with_overrides(&[&retention(MAX_RETENTION_DAYS)]).expect("the longest");
        let err = Settings::with_overrides(&[&retention(MAX_RETENTION_DAYS + 1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks.retention_days"), "{err}");
    }

    #[test]
    fn a_zero_tolerance_is_rejected() {
        let toml = "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\ntolerance_secs = 0";
        let err = Settings::with_overrides(&[toml]).unwrap_err();
        assert!(err.to_string().contains("tolerance_secs"), "{err}");
    }

    #[test]
    fn a_tolerance_as_long_as_the_dedupe_retention_is_rejected() {
        let provider = |tolerance: u64| {
            format!(
                "[webhooks]\nretention_days = 1\n[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\ntolerance_secs = {tolerance}"
            )
        };
        let err = Settings::with_overrides(&[&provider(86_400)]).unwrap_err();
        assert!(err.to_string().contains("tolerance_secs"), "{err}");
        assert!(err.to_string().contains("retention_days"), "{err}");
        Settings::with_overrides(&[&provider(86_399)]).expect("a window shorter than a day");
    }

    #[test]
    fn production_requires_token_prices_with_paddle() {
        use figment::Figment;
        use figment::providers::{Format, Toml};
        let load = |layers: &[&str]| {
            let figment = layers.iter().fold(
                Figment::new().merge(Toml::string(super::super::DEFAULT_TOML)),
                |figment, layer| figment.merge(Toml::string(layer)),
            );
            Settings::from_figment(figment, super::super::Environment::Production)
        };
        const PADDLE: &str = "[providers.paddle]\nscheme = \"paddle\"\nsecrets = [\"pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_oldOLDold0123456789\"]";
        const PRICES: &str = "[issuance.token_prices.credit]\nEUR = 100";
        let err = load(&[PADDLE]).unwrap_err().to_string();
        assert!(err.contains("`issuance.token_prices`"), "{err}");
        load(&[PADDLE, PRICES]).expect("priced");
        const PACKS: &str =
            "[providers.paddle.token_packs.pri_01ten]\ntoken_type = \"credit\"\nquantity = 10";
        let err = load(&[PADDLE, PACKS]).unwrap_err().to_string();
        assert!(
            err.contains("`issuance.token_prices`"),
            "packs alone: {err}"
        );
        load(&[PADDLE, PRICES, PACKS]).expect("priced and sold in packs");
        const UNPRICED: &str =
            "[providers.paddle.token_packs.pri_01vip]\ntoken_type = \"pass\"\nquantity = 1";
        let err = load(&[PADDLE, PRICES, UNPRICED]).unwrap_err().to_string();
        assert!(
            err.contains("providers.paddle.token_packs") && err.contains("`pass`"),
            "{err}"
        );
        Settings::with_overrides(&[PADDLE]).expect("optional outside production");
        let bad = Settings::with_overrides(&["[issuance.token_prices.credit]\nEURO = 100"]);
        assert!(bad.unwrap_err().to_string().contains("EURO"));
        let bad = Settings::with_overrides(&[
            PADDLE,
            "[providers.paddle.token_packs.price_ten]\ntoken_type = \"credit\"\nquantity = 10",
        ]);
        assert!(bad.unwrap_err().to_string().contains("price_ten"));
        let stripe_packs = Settings::with_overrides(&[
            "[providers.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\n[providers.stripe.token_packs.pri_01ten]\ntoken_type = \"credit\"\nquantity = 10",
        ]);
        let err = stripe_packs.unwrap_err().to_string();
        assert!(err.contains("providers.stripe.token_packs"), "{err}");
    }

    #[test]
    fn basic_credentials_come_as_a_pair_for_adyen_only() {
        const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
        const PASSWORD: &str = "N3verPrintMeEither";
        let adyen = |extra: &str| {
            format!("[providers.pay]\nscheme = \"adyen\"\nsecrets = [\"{KEY}\"]\n{extra}")
        };
        let user = "basic_auth_username = \"notifier\"\n";
        let password = format!("basic_auth_password = \"{PASSWORD}\"\n");
        Settings::with_overrides(&[&adyen(&format!("{user}{password}"))]).expect("a pair");
        Settings::with_overrides(&[&adyen("")]).expect("optional outside production");
        refused(
            &[&adyen(user)],
            "`providers.pay.basic_auth_password` (provider `pay`, scheme `adyen`) is required",
            &[],
        );
        refused(
            &[&adyen(&password)],
            "`providers.pay.basic_auth_username`",
            &[PASSWORD],
        );
        let colon = format!("basic_auth_username = \"a:b\"\n{password}");
        refused(
            &[&adyen(&colon)],
            "`providers.pay.basic_auth_username`",
            &[PASSWORD, "a:b"],
        );
        let empty = format!("{user}basic_auth_password = \"\"\n");
        refused(
            &[&adyen(&empty)],
            "`providers.pay.basic_auth_password`",
            &[],
        );
        let stripe = format!(
            "[providers.pay]\nscheme = \"stripe\"\nsecrets = [\"whsec_0123456789abcdef\"]\n{user}{password}"
        );
        refused(&[&stripe], "only for scheme `adyen`", &[PASSWORD]);
    }

    #[test]
    fn production_requires_basic_credentials_for_adyen() {
        use figment::Figment;
        use figment::providers::{Format, Toml};
        let load = |layer: &str| {
            let figment = Figment::new()
                .merge(Toml::string(super::super::DEFAULT_TOML))
                .merge(Toml::string(layer));
            Settings::from_figment(figment, super::super::Environment::Production)
        };
        const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
        let adyen = format!("[providers.pay]\nscheme = \"adyen\"\nsecrets = [\"{KEY}\"]\n");
        let err = load(&adyen).unwrap_err().to_string();
        assert!(
            err.contains("`providers.pay.basic_auth_username` (provider `pay`, scheme `adyen`) is required in production"),
            "{err}"
        );
        assert!(!err.contains(KEY), "{err}");
        let pair = "basic_auth_username = \"notifier\"\nbasic_auth_password = \"pw\"\n";
        load(&format!("{adyen}{pair}")).expect("with credentials");
    }
}
