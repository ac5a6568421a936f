//! HTTP API tests against a real mongod. One binary, so one mongod for all of them.

mod auth;
mod checkout;
mod hardening;
mod helpers;
mod http_conventions;
mod issuance_races;
mod issuances;
mod migrations;
mod money;
mod ops;
mod provider_events;
mod refunds;
mod repair;
mod tokens;
mod validation;
mod verify;
mod webhooks;
