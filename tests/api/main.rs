//! HTTP API tests against a real mongod. One binary, so one mongod for all of them.

mod auth;
mod helpers;
mod issuance_races;
mod issuances;
mod migrations;
mod ops;
mod provider_events;
mod tokens;
mod validation;
mod verify;
mod webhooks;
