//! Building and running the application. `Application::build` binds the listener (port 0
//! works: tests use it), so callers can read the address before serving.
//!
//! Order of a start: what can be refused without a database (production's rules, which
//! are `settings`', the API keys, the providers' secrets) is refused first, before any mongod start or
//! migration; then the database (the embedded mongod when no URI is configured),
//! migrations and the listener. A start
//! that fails once the embedded mongod runs stops it cleanly. The API keys, and the
//! development key kept beside the embedded data, are `keys`'.

mod keys;

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use anyhow::Context;
use axum::{Extension, Router};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use tokio::net::TcpListener;

use crate::domain::Provider;
use crate::embedded::EmbeddedMongo;
use crate::http::{AppState, metrics_router, router};
use crate::issuing::{
    FulfilmentWatch, IdempotencyConfig, Issuer, IssuingConfig, OplogWaiter, WaitingConfig,
    spawn_repair,
};
use crate::server::{Limits, ShuttingDown};
use crate::settings::Settings;
use crate::store::{ConnectError, RetryPolicy, Store, StoreConfig};
use crate::webhooks::Providers;
use keys::api_keys;
pub use keys::{DEV_KEY_FILE, dev_key_path, read_dev_key};

/// How often the background probe pings MongoDB for `tokenmint_mongodb_up`.
const DATABASE_PROBE_EVERY: Duration = Duration::from_secs(2);
/// The smallest `mongo.max_pool_size` the oplog waiter is held with: it keeps one
/// connection for itself, a `Prefer: wait` stream another.
const MIN_POOL_FOR_OPLOG_WAITER: u32 = 4;

/// A connected, migrated, bound application, ready to serve.
pub struct Application {
    listener: TcpListener,
    router: Router,
    /// `server.metrics_bind`'s listener and what it serves, when set.
    metrics: Option<(TcpListener, Router)>,
    store: Store,
    embedded: Option<EmbeddedMongo>,
    grace: Duration,
    limits: Limits,
    shutting_down: ShuttingDown,
    /// Wakes this instance's waiting checkouts; stopped (every waiter answered) as soon
    /// as shutdown begins. `None` on a standalone mongod, which has no change streams.
    fulfilments: Option<FulfilmentWatch>,
    /// Held until the server has stopped; `None` when `mongo.oplog_waiter_below_per_second`
    /// is 0, the pool is too small, or the deployment is not a replica set of one member.
    oplog_waiter: Option<OplogWaiter>,
    /// Its group-commit writers are stopped once the server has stopped.
    issuer: Issuer,
}

/// For operator commands (migrate, duplicates, verify): the store, on the embedded mongod
/// already running on the data directory (a running `tokenmint serve`'s, used and left
/// running) or else on one started here. Stop it afterwards with `EmbeddedMongo::stop`,
/// which leaves a mongod this process did not start alone.
pub async fn connect(settings: &Settings) -> anyhow::Result<(Store, Option<EmbeddedMongo>)> {
    open_store(settings, true, None).await
}

/// The store, starting the embedded mongod when no URI is configured; `share`: use the
/// one already running on the data directory, if any (operator commands), instead of
/// refusing to start a second one (`serve`).
async fn open_store(
    settings: &Settings,
    share: bool,
    observer: Option<EventHandler<CommandEvent>>,
) -> anyhow::Result<(Store, Option<EmbeddedMongo>)> {
    settings.require_database_uri()?;
    let embedded = if settings.mongo.configured_uri().is_none() {
        let embedded_settings = &settings.mongo.embedded;
        Some(if share {
            EmbeddedMongo::attach_or_start(embedded_settings).await?
        } else {
            EmbeddedMongo::start(embedded_settings).await?
        })
    } else {
        None
    };
    let uri = match (&embedded, settings.mongo.configured_uri()) {
        (Some(embedded), _) => embedded.uri(),
        (None, uri) => uri.unwrap_or_default(),
    };
    let connected = Store::connect(
        uri,
        &settings.mongo.database,
        settings.server_selection_timeout(),
        settings.mongo.max_pool_size,
        StoreConfig {
            duplicate_key_retries: settings.issuance.duplicate_key_retries,
            version_gate: version_gate_policy(settings),
            command_events: observer.or_else(|| {
                let telemetry = &settings.telemetry;
                crate::telemetry::commands::observer(
                    telemetry.otlp_endpoint.is_some(),
                    telemetry.mongodb_command_metrics,
                )
            }),
        },
    )
    .await;
    match connected {
        Ok(store) => Ok((store, embedded)),
        Err(err) => {
            if let Some(embedded) = embedded {
                embedded.stop().await;
            }
            // Asking for less durability, or for what a setting sets, is a configuration
            // error like any other.
            Err(match err {
                ConnectError::LessDurable(_) | ConnectError::Overridden(_) => {
                    anyhow::anyhow!("invalid configuration: {err}")
                }
                ConnectError::Invalid(_) => anyhow::Error::new(err).context("invalid mongo.uri"),
            })
        }
    }
}

impl Application {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        Self::build_observed(settings, None).await
    }

    /// `build`, with `observer` told of every MongoDB command the application sends (in
    /// place of the trace spans `telemetry.otlp_endpoint` would give them): tests check
    /// each write against the shard keys with it.
    pub async fn build_observed(
        settings: &Settings,
        observer: Option<EventHandler<CommandEvent>>,
    ) -> anyhow::Result<Self> {
        // Refused before any mongod start or migration.
        settings.require_database_uri()?;
        let keys = api_keys(settings)?;
        let providers = Providers::from_settings(&settings.providers)?;
        warn_if_few_descriptors(settings);
        let (store, embedded) = open_store(settings, false, observer).await?;
        let ready = async {
            prepare_database(settings, &store).await?;
            let listener = TcpListener::bind(settings.server.bind)
                .await
                .with_context(|| format!("cannot bind server.bind {}", settings.server.bind))?;
            let metrics_listener = match settings.server.metrics_bind {
                Some(address) => Some(
                    TcpListener::bind(address)
                        .await
                        .with_context(|| format!("cannot bind server.metrics_bind {address}"))?,
                ),
                None => None,
            };
            anyhow::Ok((listener, metrics_listener))
        }
        .await;
        let (listener, metrics_listener) = match ready {
            Ok(listeners) => listeners,
            Err(err) => {
                if let Some(embedded) = embedded {
                    embedded.stop().await;
                }
                return Err(err);
            }
        };
        tracing::info!("environment {}", settings.environment.as_str());
        tracing::info!("listening on http://{}", listener.local_addr()?);
        if let Some(metrics_listener) = &metrics_listener {
            tracing::info!(
                "metrics on http://{}/metrics",
                metrics_listener.local_addr()?
            );
        }
        let mut issuer = issuer(settings, store.clone());
        // The watcher runs before the listener serves: no request can wait unwatched.
        // Change streams need a replica set (or mongos), as transactions do; a standalone
        // mongod has neither, and a wait nothing could end would only hold checkouts for
        // nothing.
        let fulfilments = if store.supports_transactions().await? {
            Some(issuer.watch_fulfilments())
        } else {
            tracing::warn!("no replica set: `Prefer: wait` is ignored (no change streams)");
            issuer = issuer.with_waiting(WaitingConfig {
                max_waiters: 0,
                max_waiters_per_address: 0,
            });
            None
        };
        // Only a replica set of one member gains from it: a set with secondaries has their
        // oplog readers waiting already, a standalone no oplog, a mongos no oplog of its
        // own. Its `getMore` keeps one pooled connection busy nearly all the time: in a
        // pool smaller than `MIN_POOL_FOR_OPLOG_WAITER` requests would queue behind it.
        let oplog_waiter = match NonZeroU32::new(settings.mongo.oplog_waiter_below_per_second) {
            Some(below)
                if settings.mongo.max_pool_size >= MIN_POOL_FOR_OPLOG_WAITER
                    && store.is_single_member_set().await? =>
            {
                Some(issuer.hold_oplog_waiter(below))
            }
            _ => None,
        };
        if settings.repair.enabled {
            let repair = &settings.repair;
            spawn_repair(
                issuer.clone(),
                repair.interval,
                repair.min_age,
                repair.withdrawal_lookback,
            );
        }
        let state = AppState::new(issuer.clone(), keys, providers, settings);
        crate::telemetry::spawn_metrics_upkeep(state.metrics.clone());
        crate::telemetry::register_known_metrics(settings.providers.keys().map(Provider::as_str));
        let shutting_down = ShuttingDown::default();
        Ok(Self {
            listener,
            metrics: metrics_listener.map(|listener| (listener, metrics_router(state.clone()))),
            router: router(state, settings).layer(Extension(shutting_down.clone())),
            store,
            embedded,
            grace: settings.server.shutdown_grace,
            limits: Limits {
                header_read_timeout: settings.server.header_read_timeout,
                max_connections: settings.server.max_connections,
                max_connections_per_address: settings.server.max_connections_per_address,
                exempt: settings.server.trusted_proxies.clone(),
            },
            shutting_down,
            fulfilments,
            oplog_waiter,
            issuer,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The metrics listener's address, when `server.metrics_bind` is set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(listener, _)| {
            listener
                .local_addr()
                .expect("a bound listener has an address")
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The flag `run_until_stopped` sets when shutdown begins (and `/readyz` reads).
    pub fn shutting_down(&self) -> ShuttingDown {
        self.shutting_down.clone()
    }

    /// Serves until `shutdown` resolves, then at once marks the service as shutting down
    /// (`/readyz` answers 503), stops accepting, lets in-flight requests finish (for at
    /// most `server.shutdown_grace_ms`), and stops the embedded mongod last.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            listener,
            metrics,
            router,
            store,
            embedded,
            grace,
            limits,
            shutting_down,
            fulfilments,
            oplog_waiter,
            issuer,
        } = self;
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            shutting_down.begin();
            // Waiting checkouts are answered now rather than cut off after the grace.
            drop(fulfilments);
            tracing::info!("shutting down: no new connections, finishing in-flight requests");
            let _ = stopping_tx.send(());
        };
        // Handlers can extract ConnectInfo<SocketAddr>: `serve` provides it.
        let server = crate::server::serve(listener, router, limits, signal);
        // `tokenmint_mongodb_up` follows the database while serving, /readyz or not.
        let probe = crate::telemetry::spawn_database_probe(DATABASE_PROBE_EVERY, {
            let store = store.clone();
            move || {
                let store = store.clone();
                async move { store.ping().await.is_ok() }
            }
        });
        let bounded = async move {
            // Only once shutdown has begun does the grace period start counting.
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
                tracing::warn!("shutdown grace period over; abandoning unfinished requests");
            } else {
                std::future::pending::<()>().await;
            }
        };
        // Scraped until the end: the last requests' figures are still worth reading.
        let metrics = metrics.map(|(listener, router)| {
            tokio::spawn(async move { axum::serve(listener, router).await })
        });
        tokio::select! {
            () = server => {}
            () = bounded => {}
        }
        if let Some(metrics) = metrics {
            metrics.abort();
        }
        probe.abort();
        // Before the store closes: the batches the last requests queued still need it.
        // They get as long as the requests did.
        issuer.stop_writers(grace).await;
        // The store's shutdown waits for every open cursor to be dropped, the waiter's too.
        drop(oplog_waiter);
        store.shutdown().await;
        if let Some(embedded) = embedded {
            embedded.stop().await;
        }
        Ok(())
    }
}

/// The issuing service over `store`, with the rules' settings.
pub fn issuer(settings: &Settings, store: Store) -> Issuer {
    Issuer::new(
        store,
        IssuingConfig {
            default_mode: settings.issuance.default_mode,
            providers: settings.providers.keys().map(ToString::to_string).collect(),
            customer_metadata: settings
                .providers
                .iter()
                .filter(|(_, provider)| provider.scheme.customer_writes_metadata())
                .map(|(name, _)| name.to_string())
                .collect(),
            pending_ttl: Duration::from_secs(
                u64::from(settings.issuance.pending_ttl_days) * 86_400,
            ),
            idempotency: IdempotencyConfig {
                retention: settings.idempotency.retention,
                lease: settings.request_timeout(),
            },
            max_batches_in_flight: settings.issuance.max_batches_in_flight as usize,
            prices: settings.issuance.token_prices.clone(),
        },
    )
    .with_waiting(WaitingConfig {
        max_waiters: settings.issuance.max_waiters as usize,
        max_waiters_per_address: settings.issuance.max_waiters_per_address.get() as usize,
    })
}

/// The `_version` gate's backoff, from `[version_gate]`.
fn version_gate_policy(settings: &Settings) -> RetryPolicy {
    let gate = &settings.version_gate;
    RetryPolicy {
        base: gate.base_delay,
        max_jitter: gate.max_jitter,
        max_attempts: gate.max_attempts,
        budget: gate.budget,
    }
}

/// Applies migrations and the webhook retention (or, when disabled, checks that applied
/// migrations are unchanged and that the TTL index keeps events as long as
/// `webhooks.retention_days` says: a start that may not change the schema changes none of
/// it, its TTL index included, which a least-privileged user could not). A shorter
/// retention is refused: a delivery replayed within a provider's tolerance could outlive
/// its dedupe record, which the settings' own rule (tolerance below retention) forbids.
async fn prepare_database(settings: &Settings, store: &Store) -> anyhow::Result<()> {
    let retention_days = settings.webhooks.retention_days;
    if settings.migrations.apply_on_startup {
        let report = crate::migrate::run(store, false).await?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, "migrations applied");
        }
        if !report.recreated.is_empty() {
            tracing::warn!(rebuilt = ?report.recreated, "indexes of applied migrations were missing, and are built again");
        }
        store.ensure_webhook_retention(retention_days).await?;
    } else {
        crate::migrate::verify_applied(store).await?;
        let kept = store.webhook_retention_days().await?;
        if let Some(days) = kept
            && days < u64::from(retention_days)
        {
            anyhow::bail!(
                "invalid configuration: `webhooks.retention_days` is {retention_days} but \
                 webhook_events' TTL index keeps events {days} days, and this start may not \
                 change it (migrations.apply_on_startup = false): run `tokenmint migrate`"
            );
        }
        if kept != Some(u64::from(retention_days)) {
            tracing::warn!(
                kept_days = ?kept,
                retention_days,
                "webhook_events' TTL index does not keep events webhooks.retention_days: run `tokenmint migrate`"
            );
        }
    }
    Ok(())
}

/// Warns when the open-files limit cannot hold `server.max_connections` connections plus
/// the MongoDB pool: the cap would then never be reached, descriptors would run out first.
fn warn_if_few_descriptors(settings: &Settings) {
    #[cfg(unix)]
    {
        // `None`: unlimited.
        let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current
        else {
            return;
        };
        let needed =
            settings.server.max_connections as u64 + u64::from(settings.mongo.max_pool_size) + 64;
        if limit < needed {
            tracing::warn!(
                open_files_limit = limit,
                needed,
                "the open-files limit is below server.max_connections plus the MongoDB pool; raise it (ulimit -n) or lower server.max_connections"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = settings;
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
