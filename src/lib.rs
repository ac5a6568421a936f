//! tokenmint: issues tokens for payments, exactly once per payment, backed by MongoDB.
//!
//! Layers, outermost first: `cli` → `startup` → `http` (routes, auth, error envelope) →
//! `domain` (validated types) → `store` (every MongoDB call) and `migrate` (schema).

pub mod cli;
pub mod domain;
pub mod embedded;
pub mod http;
pub mod migrate;
pub mod settings;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod webhooks;
