//! The store's document, filter and command builders and its retry bounds, public for
//! the benchmark's database floors: they issue exactly the documents and commands the
//! service issues, built by the same code, instead of copies kept in step by hand. The
//! service itself calls these where they are defined.

pub use super::documents::new_token;
pub use super::filters::{issuance_filter, payment_tokens_filter, token_filter};

/// Tries of a transaction that ends in a transient error (`retry::TRANSACTION`).
pub const MAX_TRANSACTION_ATTEMPTS: u32 = super::retry::TRANSACTION.max_attempts;
/// Retries, after the first try, of the first-insert race of two upserts of a new key
/// (`retry::FIRST_INSERT`).
pub const RECORD_RACE_RETRIES: u32 = super::retry::FIRST_INSERT.max_attempts - 1;
pub use super::token_bulk::{BulkFailure, bulk_command, first_failure, upserted_ids};
