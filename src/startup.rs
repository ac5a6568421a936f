//! Building and running the application. `Application::build` binds the listener (port 0
//! works: tests use it), so callers can read the address before serving.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use crate::embedded::EmbeddedMongo;
use crate::http::auth::{ApiKeys, generate_dev_key};
use crate::http::{AppState, router};
use crate::issuing::{Issuer, IssuingConfig, spawn_repair};
use crate::settings::Settings;
use crate::store::{RetryPolicy, Store, StoreConfig};

/// A connected, migrated, bound application, ready to serve.
pub struct Application {
    listener: TcpListener,
    router: Router,
    store: Store,
    embedded: Option<EmbeddedMongo>,
    grace: Duration,
}

/// The store for `settings`, starting the embedded mongod when no URI is configured.
pub async fn connect(settings: &Settings) -> anyhow::Result<(Store, Option<EmbeddedMongo>)> {
    let embedded = if settings.mongo.uri.is_empty() {
        Some(EmbeddedMongo::start(&settings.mongo.embedded).await?)
    } else {
        None
    };
    let uri = embedded
        .as_ref()
        .map_or(settings.mongo.uri.as_str(), |e| e.uri());
    let store = Store::connect(
        uri,
        &settings.mongo.database,
        settings.server_selection_timeout(),
        settings.mongo.max_pool_size,
        StoreConfig {
            duplicate_key_retries: settings.issuance.duplicate_key_retries,
            version_gate: version_gate_policy(settings),
        },
    )
    .await
    .context("invalid mongo.uri")?;
    Ok((store, embedded))
}

impl Application {
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let (store, embedded) = connect(settings).await?;
        if let Err(err) = prepare_database(settings, &store).await {
            if let Some(embedded) = embedded {
                embedded.stop().await;
            }
            return Err(err);
        }
        let keys = api_keys(settings)?;
        let issuer = issuer(settings, store.clone());
        if settings.repair.enabled {
            spawn_repair(
                issuer.clone(),
                Duration::from_millis(settings.repair.interval_ms),
                Duration::from_millis(settings.repair.min_age_ms),
            );
        }
        let state = AppState::new(issuer, keys, settings);
        crate::telemetry::spawn_metrics_upkeep(state.metrics.clone());
        let listener = TcpListener::bind(settings.server.bind)
            .await
            .with_context(|| format!("cannot bind server.bind {}", settings.server.bind))?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        Ok(Self {
            listener,
            router: router(state, settings),
            store,
            embedded,
            grace: Duration::from_millis(settings.server.shutdown_grace_ms),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests
    /// finish (for at most `server.shutdown_grace_ms`), and stops the embedded mongod last.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections, finishing in-flight requests");
            let _ = stopping_tx.send(());
        };
        let server = axum::serve(self.listener, self.router).with_graceful_shutdown(signal);
        let grace = self.grace;
        let bounded = async move {
            // Only once shutdown has begun does the grace period start counting.
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
                tracing::warn!("shutdown grace period over; abandoning unfinished requests");
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = server => result.context("server error"),
            () = bounded => Ok(()),
        };
        self.store.shutdown().await;
        if let Some(embedded) = self.embedded {
            embedded.stop().await;
        }
        result
    }
}

/// The issuing service over `store`, with the rules' settings.
pub fn issuer(settings: &Settings, store: Store) -> Issuer {
    Issuer::new(
        store,
        IssuingConfig {
            default_mode: settings.issuance.default_mode,
            providers: settings.providers.keys().cloned().collect(),
            pending_ttl: Duration::from_secs(
                u64::from(settings.issuance.pending_ttl_days) * 86_400,
            ),
        },
    )
}

/// The `_version` gate's backoff, from `[version_gate]`.
fn version_gate_policy(settings: &Settings) -> RetryPolicy {
    let gate = &settings.version_gate;
    RetryPolicy {
        base: Duration::from_millis(gate.base_delay_ms),
        max_jitter: Duration::from_millis(gate.max_jitter_ms),
        max_attempts: gate.max_attempts,
        budget: Duration::from_millis(gate.budget_ms),
    }
}

/// Applies migrations (or, when disabled, checks that applied ones are unchanged).
async fn prepare_database(settings: &Settings, store: &Store) -> anyhow::Result<()> {
    if settings.migrations.apply_on_startup {
        let report = crate::migrate::run(store, false).await?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, "migrations applied");
        }
    } else {
        crate::migrate::verify_applied(store).await?;
    }
    store
        .ensure_webhook_retention(settings.webhooks.retention_days)
        .await?;
    Ok(())
}

/// The configured keys; with none, a development start gets a random admin key, printed
/// once, and a production start refuses to run.
fn api_keys(settings: &Settings) -> anyhow::Result<ApiKeys> {
    if !settings.auth.keys.is_empty() {
        return Ok(ApiKeys::from_settings(&settings.auth.keys));
    }
    if settings.is_production() {
        anyhow::bail!("TOKENMINT_ENV=production requires at least one [[auth.keys]] entry");
    }
    let (key, key_settings) = generate_dev_key();
    // Printed to the terminal, never logged: log pipelines must not carry keys.
    eprintln!(
        "\nNo API key is configured, so this development start generated an admin key (shown once):\n\n    {key}\n\nUse it as: Authorization: Bearer {key}\n"
    );
    Ok(ApiKeys::from_settings(&[key_settings]))
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
