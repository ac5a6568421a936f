//! The names of the indexes the code refers to, each defined here once. The indexes are
//! created by the migrations (immutable, checksummed history, so the names are repeated
//! there by necessity); the code needs the names to tell which unique index a duplicate
//! key hit. A test checks every name below against the migration that creates it, on the
//! collection the code expects.

/// The unique index on `tokens` (provider, accountId, paymentIntentId, tokenIndex).
pub const TOKENS_PAYMENT_INDEX: &str = "uniq_token_payment_index";
/// The unique index on `issuances` (provider, accountId, paymentIntentId).
pub const ISSUANCES_PAYMENT_INDEX: &str = "uniq_issuance_payment";
/// The unique index on `payments` (provider, accountId, paymentIntentId).
pub const PAYMENTS_INDEX: &str = "uniq_payment";
/// The unique index on `idempotency_keys` (keyId, key).
pub const IDEMPOTENCY_KEY_INDEX: &str = "uniq_idempotency_key";
/// The unique index on `redemptions` (owner, reference).
pub const REDEMPTIONS_REFERENCE_INDEX: &str = "uniq_redemption_reference";
/// The TTL index on `webhook_events`. Not a migration file's, because its expiry follows
/// `webhooks.retention_days`, which an operator may change: set by `tokenmint migrate`
/// and by a start that applies migrations.
pub const WEBHOOK_EVENTS_TTL_INDEX: &str = "webhook_events_ttl";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::{Step, migrations};
    use crate::store::idempotency::IDEMPOTENCY_KEYS;
    use crate::store::payments::PAYMENTS;
    use crate::store::redemptions::REDEMPTIONS;
    use crate::store::{ISSUANCES, TOKENS};

    #[test]
    fn every_unique_index_the_code_names_is_created_by_a_migration_on_its_collection() {
        let created: Vec<(String, String, bool)> = migrations()
            .unwrap()
            .into_iter()
            .flat_map(|m| m.steps)
            .filter_map(|step| match step {
                Step::CreateIndex(index) => Some((index.collection, index.name, index.unique)),
                _ => None,
            })
            .collect();
        for (collection, name) in [
            (TOKENS, TOKENS_PAYMENT_INDEX),
            (ISSUANCES, ISSUANCES_PAYMENT_INDEX),
            (PAYMENTS, PAYMENTS_INDEX),
            (IDEMPOTENCY_KEYS, IDEMPOTENCY_KEY_INDEX),
            (REDEMPTIONS, REDEMPTIONS_REFERENCE_INDEX),
        ] {
            assert!(
                created.contains(&(collection.to_owned(), name.to_owned(), true)),
                "no migration creates the unique index {name} on {collection}: {created:?}"
            );
        }
        assert!(
            !created
                .iter()
                .any(|(_, name, _)| name == WEBHOOK_EVENTS_TTL_INDEX),
            "the TTL index is created at startup, not by a migration"
        );
    }
}
