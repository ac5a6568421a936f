//! HTTP API tests against a real mongod. One binary, so one mongod for all of them.

mod adyen;
mod atomic_batches;
mod audit;
mod auth;
mod batch_reads;
mod chargebacks;
mod checkout;
mod hardening;
mod helpers;
mod http_conventions;
mod issuance_races;
mod issuances;
mod migrations;
mod migrations_load;
mod money;
mod ops;
mod paddle;
mod prefer_wait;
mod provider_events;
mod refunds;
mod repair;
mod sign_command;
mod tokens;
mod validation;
mod verify;
mod webhooks;
