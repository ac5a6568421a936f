//! The store's document, filter and command builders and its retry bounds, public for
//! the benchmark's database floors: they issue exactly the documents and commands the
//! service issues, built by the same code, instead of copies kept in step by hand. The
//! service itself calls these where they are defined.

pub use super::atomic::MAX_TRANSACTION_ATTEMPTS;
pub use super::documents::new_token;
pub use super::filters::{issuance_filter, payment_tokens_filter, token_filter};
pub use super::issuance::RECORD_RACE_RETRIES;
pub use super::token_bulk::{BulkFailure, bulk_command, first_failure, upserted_ids};
