//! tokenmint: issues tokens for payments, exactly once per payment, backed by MongoDB.
//!
//! Layers, outermost first, each using only the ones after it: `cli` → `startup` →
//! `http` (routes, auth, error envelope) and `webhooks` (signatures, event parsing) →
//! `issuing` (every business rule) → `store` (every MongoDB call, no decisions) and
//! `migrate` (schema) → `domain` (validated types). `settings`, `telemetry`, `embedded`
//! and `server` (the hardened HTTP/1.1 connection loop) are leaves the outer layers
//! configure the inner ones from; `healthcheck` is the client side of `/readyz` that
//! `tokenmint healthcheck` runs. `tests/layers.rs` holds the code to this: no import runs
//! back up the layers, and no two files import each other.

pub mod cli;
pub mod domain;
pub mod embedded;
pub mod healthcheck;
pub mod http;
pub mod issuing;
pub mod migrate;
pub mod server;
pub mod settings;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod webhooks;
