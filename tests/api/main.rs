//! HTTP API tests against a real mongod. One binary, so one mongod for all of them.

mod helpers;
mod issuance_races;
mod issuances;
mod ops;
mod tokens;
mod webhooks;
