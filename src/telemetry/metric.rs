//! The catalogue of every metric tokenmint emits: its name, its help text, and the label
//! values known in advance. Code records through these constants, never a bare string,
//! so a name cannot drift from its description.
//!
//! Counters whose label values are known up front are registered at 0 when the recorder
//! is installed: a dashboard's `rate()` and an alert on "any signature rejected" need a
//! series before the first event, not after it.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// HTTP requests by `method`, `route` (the template) and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "tokenmint_http_requests_total";
/// HTTP request latency, by the same labels.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "tokenmint_http_request_duration_seconds";
/// Issuance requests by `outcome` (`ISSUANCE_OUTCOMES`).
pub const ISSUANCES_TOTAL: &str = "tokenmint_issuances_total";
/// Tokens inserted.
pub const TOKENS_CREATED_TOTAL: &str = "tokenmint_tokens_created_total";
/// Tokens revoked because their payment no longer stands for them, by `reason`: active
/// ones a settle revoked, and those of a share written revoked.
pub const TOKENS_REVOKED_TOTAL: &str = "tokenmint_tokens_revoked_total";
/// Tokens a withdrawal had revoked made active again, because the money came back.
pub const TOKENS_REACTIVATED_TOTAL: &str = "tokenmint_tokens_reactivated_total";
/// Unfinished issuances finished by self-repair, by `outcome`.
pub const REPAIRS_TOTAL: &str = "tokenmint_repairs_total";
/// Issuance requests waiting for their payment's event (`Prefer: wait`).
pub const ISSUANCE_WAITERS: &str = "tokenmint_issuance_waiters";
/// Issuances committed together by one group commit (either mode).
pub const ISSUANCE_BATCH_SIZE: &str = "tokenmint_issuance_batch_size";
/// Time an issuance waited in its mode's queue for a writer task to take it into a
/// batch, by `mode`: near zero while a writer is free; when the batches in flight are
/// all the limit allows, up to a batch's commit. The part of a request's latency that group commit adds.
pub const ISSUANCE_QUEUE_WAIT_SECONDS: &str = "tokenmint_issuance_queue_wait_seconds";
/// How many batches of a mode may be committed at once, by `mode`: 2, or the number from
/// 2 to `issuance.max_batches_in_flight` the writers found answers requests soonest (one
/// more or one fewer during a trial).
pub const ISSUANCE_BATCHES_IN_FLIGHT: &str = "tokenmint_issuance_batches_in_flight";
/// Redemptions that shared one transaction attempt (see `BATCH_SIZE_BUCKETS`).
pub const REDEMPTION_BATCH_SIZE: &str = "tokenmint_redemption_batch_size";
/// Upsert-mode batches whose mark came from another term than their token insert (an
/// election between the two): their sets were settled again one by one.
pub const BATCH_TERM_CHANGES_TOTAL: &str = "tokenmint_batch_term_changes_total";
/// Duplicate-key races retried.
pub const DUPLICATE_KEY_RETRIES_TOTAL: &str = "tokenmint_duplicate_key_retries_total";
/// Transactions retried after a transient error.
pub const TRANSACTION_RETRIES_TOTAL: &str = "tokenmint_transaction_retries_total";
/// Stale writes rejected by the `_version` gate, by `collection` and `operation`.
pub const VERSION_GATE_REJECTIONS_TOTAL: &str = "tokenmint_version_gate_rejections_total";
/// Webhook deliveries by `provider` (a configured name, `-` for an unknown one) and
/// `outcome`.
pub const WEBHOOK_EVENTS_TOTAL: &str = "tokenmint_webhook_events_total";
/// Time from a verified webhook's parse to its outcome (dedupe, apply, settle), by
/// `provider` (a configured name); an Adyen batch counts each item.
pub const WEBHOOK_PROCESSING_DURATION_SECONDS: &str =
    "tokenmint_webhook_processing_duration_seconds";
/// MongoDB commands' latency by `command` (a closed set, else `other`) and `outcome`
/// (`ok`, `error`); only with `telemetry.mongodb_command_metrics`.
pub const MONGODB_COMMAND_DURATION_SECONDS: &str = "tokenmint_mongodb_command_duration_seconds";
/// Requests refused by a rate limit.
pub const RATE_LIMITED_TOTAL: &str = "tokenmint_rate_limited_total";
/// The `limiter` label of `RATE_LIMITED_TOTAL`: a trusted key's bucket, a checkout key's
/// client address, a webhook provider's, a client address's failed signature checks.
pub const RATE_LIMITERS: &[&str] = &["key", "address", "provider", "signature"];
/// 1 while MongoDB answers the background probe, 0 while it does not.
pub const MONGODB_UP: &str = "tokenmint_mongodb_up";
/// Always 1, labelled with the running `version`.
pub const BUILD_INFO: &str = "tokenmint_build_info";

/// Buckets of every `_seconds` histogram: 1 ms to 60 s, since a `Prefer: wait` request
/// may be held 30 s and a request timeout can be set longer than the default 10 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of `ISSUANCE_BATCH_SIZE` and `REDEMPTION_BATCH_SIZE`: powers of two up to
/// the most one batch gathers (256 issuances).
pub const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// `outcome` values of `ISSUANCES_TOTAL`.
pub const ISSUANCE_OUTCOMES: &[&str] = &["created", "replayed", "pending", "conflict"];
/// `outcome` values of `REPAIRS_TOTAL`.
pub const REPAIR_OUTCOMES: &[&str] = &["completed", "revoked", "failed"];
/// `operation` values of `VERSION_GATE_REJECTIONS_TOTAL` on `tokens`.
pub const TOKEN_OPERATIONS: &[&str] = &["redeem", "revoke", "transfer"];
/// `outcome` values of `WEBHOOK_EVENTS_TOTAL` for a configured provider: refused before
/// processing, then what the event did.
pub const WEBHOOK_OUTCOMES: &[&str] = &[
    "credentials_rejected",
    "signature_rejected",
    "malformed",
    "duplicate",
    "issued",
    "already_issued",
    "revoked",
    "reinstated",
    "recorded",
    "stale",
    "ignored",
    "metadata_invalid",
    "no_metadata",
    "conflict",
    "terminal",
    "metadata_conflict",
];

/// Gives every metric its help text (and unit).
pub(super) fn describe() {
    describe_counter!(
        HTTP_REQUESTS_TOTAL,
        "HTTP requests by method, route template and status"
    );
    describe_histogram!(
        HTTP_REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "HTTP request latency"
    );
    describe_counter!(
        ISSUANCES_TOTAL,
        "Issuance requests by outcome (created, replayed, pending, conflict)"
    );
    describe_gauge!(
        ISSUANCE_WAITERS,
        "Issuance requests waiting for their payment's event (Prefer: wait)"
    );
    describe_counter!(TOKENS_CREATED_TOTAL, "Tokens inserted");
    describe_counter!(
        TOKENS_REVOKED_TOTAL,
        "Tokens revoked because their payment no longer stands for them (active ones revoked, and a refunded share written revoked), by reason (refunded, canceled, partial_refund)"
    );
    describe_counter!(
        TOKENS_REACTIVATED_TOTAL,
        "Tokens a withdrawal had revoked made active again, because the money came back"
    );
    describe_counter!(
        REPAIRS_TOTAL,
        "Unfinished issuances finished by self-repair, by outcome (completed, revoked, failed)"
    );
    describe_histogram!(
        ISSUANCE_BATCH_SIZE,
        "Issuances committed together by one group commit (either mode)"
    );
    describe_histogram!(
        ISSUANCE_QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time an issuance waited for a batch writer, by mode (upsert, atomic)"
    );
    describe_gauge!(
        ISSUANCE_BATCHES_IN_FLIGHT,
        "How many batches of a mode may be committed at once, by mode: 2, or the number up to issuance.max_batches_in_flight found to answer requests soonest"
    );
    describe_histogram!(
        REDEMPTION_BATCH_SIZE,
        "Redemptions that shared one transaction attempt (redemptions of several owners committed together)"
    );
    describe_counter!(
        BATCH_TERM_CHANGES_TOTAL,
        "Upsert batches whose mark came from another term than their token insert (an election between them): their sets were settled again one by one"
    );
    describe_counter!(DUPLICATE_KEY_RETRIES_TOTAL, "Duplicate-key races retried");
    describe_counter!(
        TRANSACTION_RETRIES_TOTAL,
        "Transactions retried after a transient error"
    );
    describe_counter!(
        VERSION_GATE_REJECTIONS_TOTAL,
        "Stale writes rejected by the _version gate, by collection and operation"
    );
    describe_counter!(
        WEBHOOK_EVENTS_TOTAL,
        "Webhook deliveries by provider and outcome (signature_rejected counts forgeries per provider)"
    );
    describe_histogram!(
        MONGODB_COMMAND_DURATION_SECONDS,
        Unit::Seconds,
        "MongoDB command latency by command and outcome (with telemetry.mongodb_command_metrics)"
    );
    describe_histogram!(
        WEBHOOK_PROCESSING_DURATION_SECONDS,
        Unit::Seconds,
        "Time to apply a verified webhook event, by provider"
    );
    describe_counter!(
        RATE_LIMITED_TOTAL,
        "Requests refused by a rate limit, by limiter (key, address, provider, signature)"
    );
    describe_gauge!(
        MONGODB_UP,
        "1 while MongoDB answers the background ping, 0 while it does not"
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label names the running build"
    );
}

/// Registers at 0 every counter series whose labels are known before anything happens,
/// webhook ones for each configured provider; sets `BUILD_INFO`.
pub(super) fn register_known<'a>(providers: impl IntoIterator<Item = &'a str>) {
    for name in [
        TOKENS_CREATED_TOTAL,
        TOKENS_REACTIVATED_TOTAL,
        BATCH_TERM_CHANGES_TOTAL,
        DUPLICATE_KEY_RETRIES_TOTAL,
        TRANSACTION_RETRIES_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
    for &limiter in RATE_LIMITERS {
        metrics::counter!(RATE_LIMITED_TOTAL, "limiter" => limiter).increment(0);
    }
    for &outcome in ISSUANCE_OUTCOMES {
        metrics::counter!(ISSUANCES_TOTAL, "outcome" => outcome).increment(0);
    }
    for reason in crate::domain::RevocationReason::ALL {
        metrics::counter!(TOKENS_REVOKED_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    for &outcome in REPAIR_OUTCOMES {
        metrics::counter!(REPAIRS_TOTAL, "outcome" => outcome).increment(0);
    }
    for &operation in TOKEN_OPERATIONS {
        metrics::counter!(VERSION_GATE_REJECTIONS_TOTAL, "collection" => "tokens", "operation" => operation)
            .increment(0);
    }
    for provider in providers {
        for &outcome in WEBHOOK_OUTCOMES {
            metrics::counter!(WEBHOOK_EVENTS_TOTAL, "provider" => provider.to_owned(), "outcome" => outcome)
                .increment(0);
        }
    }
    // Registered, not set: requests may already be waiting when another app is built in
    // the same process (tests do).
    metrics::gauge!(ISSUANCE_WAITERS).increment(0.0);
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}
