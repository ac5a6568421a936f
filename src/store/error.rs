//! Store errors, and the one place where driver errors are classified: by kind for
//! outages, by index name for duplicate keys (a duplicate key on the token
//! index is a race to retry, any other duplicate key is a real error).

use mongodb::error::{
    Error, ErrorKind, InsertManyError, TRANSIENT_TRANSACTION_ERROR, WriteFailure,
};

pub use super::indexes::{ISSUANCES_PAYMENT_INDEX, TOKENS_PAYMENT_INDEX};

/// What can go wrong below the HTTP layer. Driver text stays inside: the HTTP layer turns
/// these into generic problems and logs the source once.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// MongoDB cannot be reached (server selection timed out, network, failover).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] Error),
    /// A payment's keys kept conflicting with another transaction through every retry:
    /// most likely one a crashed instance left open, which the server aborts when its
    /// lifetime ends (`transactionLifetimeLimitSeconds`). Retrying later succeeds; the
    /// other payments of a shared transaction need not wait for it.
    #[error("transaction kept conflicting: {0}")]
    Contended(#[source] Error),
    /// `atomic` mode was asked of a deployment without transactions (a standalone server).
    #[error("transactions are not available on this deployment")]
    TransactionsUnavailable,
    /// Anything else: a bug or an unexpected server answer.
    #[error("database error: {0}")]
    Internal(String),
}

impl StoreError {
    /// Unavailability the service concludes itself, with no driver error to carry (a
    /// write concern error read from a reply, a record lost to a failover, a majority that
    /// does not show a change yet): retry later. `message` is logged, never answered.
    pub fn unavailable(message: impl Into<String>) -> Self {
        StoreError::Unavailable(Error::custom(message.into()))
    }
}

impl From<Error> for StoreError {
    fn from(err: Error) -> Self {
        if is_unavailable(&err) {
            StoreError::Unavailable(err)
        } else {
            StoreError::Internal(err.to_string())
        }
    }
}

/// Server codes meaning "this node cannot take the write now" (failover, shutdown).
const NOT_PRIMARY_CODES: [i32; 8] = [91, 189, 10107, 11600, 11602, 13435, 13436, 262];

/// Server codes meaning "a node behind this one could not be reached" (HostUnreachable,
/// HostNotFound, NetworkTimeout, SocketException, FailedToSatisfyReadPreference): what a
/// router answers while a shard elects. The driver labels such errors retryable only on
/// the commands it retries itself; a command written by hand is classified by code. A
/// lasting cause (a shard host missing from DNS) then answers 503 for as long as it
/// lasts, logged as unavailability: the write's outcome is unknown, so a 500 would be no
/// truer, and a retry is safe.
const UNREACHABLE_CODES: [i32; 5] = [6, 7, 89, 9001, 133];

/// True for a server code that means unavailability (`NOT_PRIMARY_CODES`,
/// `UNREACHABLE_CODES`), wherever it comes: a command's error, a write error of one
/// statement, a write concern error. Written once, because a code classed as a bug in one
/// of those places turns a failover into a 500 with the write perhaps applied.
pub(super) fn unavailable_code(code: i32) -> bool {
    NOT_PRIMARY_CODES.contains(&code) || UNREACHABLE_CODES.contains(&code)
}

/// Server codes refusing one document for what it is (DocumentValidationFailure,
/// BSONObjectTooLarge, an update whose result would pass 16 MiB): the same write of
/// another document may pass.
const DOCUMENT_REFUSED_CODES: [i32; 3] = [121, 10334, 17419];

/// True when the server refused a write for the document it would write, not for
/// anything every write shares (rights, disk, an outage): a command's error or a write
/// error of one statement.
pub(super) fn refuses_the_document(err: &Error) -> bool {
    match err.kind.as_ref() {
        ErrorKind::Command(cmd) => DOCUMENT_REFUSED_CODES.contains(&cmd.code),
        ErrorKind::Write(WriteFailure::WriteError(write)) => {
            DOCUMENT_REFUSED_CODES.contains(&write.code)
        }
        _ => false,
    }
}

/// True when the error means MongoDB is (perhaps briefly) unreachable or electing.
pub fn is_unavailable(err: &Error) -> bool {
    match err.kind.as_ref() {
        ErrorKind::ServerSelection { .. }
        | ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::Shutdown => true,
        ErrorKind::Command(cmd) => unavailable_code(cmd.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(wce))
        | ErrorKind::InsertMany(InsertManyError {
            write_errors: None,
            write_concern_error: Some(wce),
            ..
        }) => write_concern_unconfirmed(wce.code),
        _ => err.contains_label("RetryableWriteError"),
    }
}

/// True when a write concern error means "written, but not confirmed durable": the node
/// stepped down, or a router could not reach the shard (`unavailable_code`), or the
/// majority did not confirm in time (`maxTimeMS` 50, the URI's `wtimeoutMS` 64). Nothing
/// of such a write may be acknowledged, and the client retries: every write is
/// idempotent, so the retry answers from what the majority then has. Any other write
/// concern error (an unknown `w` mode, say) is a deployment's misconfiguration, which
/// retrying does not cure.
pub(super) fn write_concern_unconfirmed(code: i32) -> bool {
    const NOT_CONFIRMED_IN_TIME: [i32; 2] = [50, 64];
    unavailable_code(code) || NOT_CONFIRMED_IN_TIME.contains(&code)
}

/// How long the server may wait on a document another transaction holds before a write
/// gives up (`maxTimeMS`), for the writes of a token and of an `Idempotency-Key`'s record
/// outside a transaction. A transaction holds a document for milliseconds; one that holds
/// it longer was left open by a dead instance, and the server ends it only after
/// `transactionLifetimeLimitSeconds` (60 s by default). A write must not wait that long:
/// its client would be answered (timed out) first, and the write would still apply
/// whenever the transaction ended.
pub(super) const HELD_PATIENCE: std::time::Duration = std::time::Duration::from_millis(1000);

/// MaxTimeMSExpired: the server stopped a command that ran past its `maxTimeMS`.
pub(super) const MAX_TIME_EXPIRED: i32 = 50;

/// True when the server stopped the command at its `maxTimeMS`.
pub(super) fn ran_out_of_time(err: &Error) -> bool {
    command_code(err) == Some(MAX_TIME_EXPIRED)
}

/// The server code of a command that failed as a whole.
pub(super) fn command_code(err: &Error) -> Option<i32> {
    match err.kind.as_ref() {
        ErrorKind::Command(cmd) => Some(cmd.code),
        _ => None,
    }
}

/// True for errors a transaction should be retried from the start on.
pub fn is_transient_transaction_error(err: &Error) -> bool {
    err.contains_label(TRANSIENT_TRANSACTION_ERROR)
}

/// True when another transaction's write of the same document or key is in the way
/// (WriteConflict 112, LockTimeout 24), as opposed to an outage.
pub fn is_write_conflict(err: &Error) -> bool {
    const WRITE_CONFLICT: i32 = 112;
    const LOCK_TIMEOUT: i32 = 24;
    let code = match err.kind.as_ref() {
        ErrorKind::Command(cmd) => Some(cmd.code),
        ErrorKind::Write(WriteFailure::WriteError(e)) => Some(e.code),
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|errors| errors.first())
            .map(|e| e.code),
        _ => None,
    };
    matches!(code, Some(WRITE_CONFLICT | LOCK_TIMEOUT))
}

/// Whether `err` says the collection does not exist (NamespaceNotFound): for a read of
/// its indexes, none.
pub fn is_namespace_not_found(err: &Error) -> bool {
    const NAMESPACE_NOT_FOUND: i32 = 26;
    matches!(err.kind.as_ref(), ErrorKind::Command(c) if c.code == NAMESPACE_NOT_FOUND)
}

/// The index named in a duplicate-key (E11000) error, if `err` is one.
pub fn duplicate_key_index(err: &Error) -> Option<String> {
    let message = match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == 11000 => &e.message,
        ErrorKind::Command(e) if e.code == 11000 => &e.message,
        ErrorKind::InsertMany(e) => {
            let first = e.write_errors.as_ref()?.iter().find(|w| w.code == 11000)?;
            &first.message
        }
        _ => return None,
    };
    Some(index_in_message(message).unwrap_or_default())
}

/// Parses `... index: <name> dup key: ...` out of a server duplicate-key message.
pub fn index_in_message(message: &str) -> Option<String> {
    let rest = message.split_once("index: ")?.1;
    Some(rest.split_whitespace().next()?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_index_name() {
        let msg = "E11000 duplicate key error collection: db.tokens index: uniq_token_payment_index dup key: { origin.provider: \"s\" }";
        assert_eq!(index_in_message(msg).as_deref(), Some(TOKENS_PAYMENT_INDEX));
        assert_eq!(index_in_message("E11000 duplicate key"), None);
    }

    #[test]
    fn a_write_concern_error_is_unconfirmed_for_every_unavailable_code_and_a_timeout_only() {
        for code in NOT_PRIMARY_CODES.into_iter().chain(UNREACHABLE_CODES) {
            assert!(write_concern_unconfirmed(code), "code {code}");
        }
        assert!(write_concern_unconfirmed(50) && write_concern_unconfirmed(64));
        // UnknownReplWriteConcern, UnsatisfiableWriteConcern: a deployment's mistake,
        // which a retry does not cure.
        assert!(!write_concern_unconfirmed(79) && !write_concern_unconfirmed(100));
    }
}
