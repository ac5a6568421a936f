//! What every command tokenmint sends is pinned to, whatever `mongo.uri` or the server's
//! defaults say: writes acknowledged by a majority and journaled (an acknowledged redeem,
//! refund or issuance survives a failover), reads at read concern `majority` (an answer
//! never rests on a write a failover could roll back) and on the primary (a lagging
//! secondary never decides). A URI asking for less is refused rather than silently
//! overridden, so that what the operator wrote and what runs never disagree. The one
//! exception is group commit's record and token inserts on a replica set, which the
//! primary alone acknowledges: nothing is answered from them before the batch's majority
//! mark, and only when that mark is shown to cover them (`OpTime::covered_by`).
//!
//! Only an option's name and value are ever told, never the URI: it may carry credentials.

use mongodb::bson::{RawDocumentBuf, Timestamp};
use mongodb::options::{
    Acknowledgment, ClientOptions, ReadConcern, ReadConcernLevel, ReadPreference,
    SelectionCriteria, WriteConcern,
};
use mongodb::{ClientSession, Database};

/// Starts a transaction on `session` that reads one snapshot. Its commit inherits the
/// client's pinned `w: majority`, journaled, like every other write.
pub(super) async fn start_snapshot_transaction(
    session: &mut ClientSession,
) -> mongodb::error::Result<()> {
    session
        .start_transaction()
        .read_concern(ReadConcern::snapshot())
        .await
}

/// Aborts the transaction on `session`, so that a refused or failed attempt leaves
/// nothing behind and the session is clean for the next one. The abort's own failure is
/// moot: the server drops a transaction nobody commits.
pub(super) async fn abort_quietly(session: &mut ClientSession) {
    let _ = session.abort_transaction().await;
}

/// Why `Store::connect` did not build a client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `mongo.uri` asks for less durability than tokenmint needs; the message names the
    /// option, as a configuration error does.
    #[error("`mongo.uri` {0}")]
    LessDurable(String),
    /// `mongo.uri` sets an option a setting (or tokenmint itself) sets otherwise.
    #[error("`mongo.uri` {0}")]
    Overridden(String),
    /// The URI does not parse, or the driver refused its options.
    #[error(transparent)]
    Invalid(#[from] super::StoreError),
}

impl From<mongodb::error::Error> for ConnectError {
    fn from(err: mongodb::error::Error) -> Self {
        Self::Invalid(err.into())
    }
}

/// `w: "majority"`, journaled: the write concern of every write that records money or
/// tokens. `wtimeout` is the URI's `wtimeoutMS`, if any.
pub(super) fn durable_writes(wtimeout: Option<std::time::Duration>) -> WriteConcern {
    let mut concern = WriteConcern::builder()
        .w(Acknowledgment::Majority)
        .journal(true)
        .build();
    concern.w_timeout = wtimeout;
    concern
}

/// `durable_writes` without a `wtimeout`, as a command's `writeConcern`: what
/// `pinned_command_writes` falls back to for a client without a write concern.
fn durable_command_writes() -> RawDocumentBuf {
    mongodb::bson::rawdoc! { "w": "majority", "j": true }
}

/// The client's pinned write concern (`durable_writes`, with the URI's `wtimeoutMS`) as a
/// command's `writeConcern`, for a command built by hand that must wait for the majority
/// no longer than the driver's own writes do.
pub(super) fn pinned_command_writes(db: &Database) -> RawDocumentBuf {
    db.write_concern()
        .and_then(|concern| mongodb::bson::to_raw_document_buf(concern).ok())
        .unwrap_or_else(durable_command_writes)
}

/// A point in a replica set's history, as a write command's reply tells it (`opTime`): the
/// term of the primary that acknowledged it, and the position in that primary's oplog.
/// One primary per term, and its oplog only grows within its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct OpTime {
    #[serde(rename = "t")]
    pub term: i64,
    pub ts: Timestamp,
}

impl OpTime {
    /// Whether a write acknowledged here is durable once `later`, a write acknowledged
    /// with `w: majority`, is: when the same primary, in the same term, acknowledged
    /// `later` at or after this point. Its oplog then holds this write before `later`,
    /// and a majority commit point covers every entry before it. Another term means
    /// another primary, or this one after an election, whose oplog may have lost this
    /// write in a rollback.
    pub fn covered_by(&self, later: &OpTime) -> bool {
        self.term == later.term && self.ts <= later.ts
    }
}

/// Refuses `options` (as parsed from `mongo.uri`) when they ask for less than majority
/// journaled writes, majority reads or the primary; then pins all three. Only `majority`
/// counts as enough for `w`: a number of nodes or a tag set is refused even when it
/// happens to cover a majority today, because the set may grow and it then would not.
/// `wtimeoutMS` is kept.
pub(super) fn pin_durability(options: &mut ClientOptions) -> Result<(), ConnectError> {
    if let Some(concern) = &options.write_concern {
        let asked = match &concern.w {
            None | Some(Acknowledgment::Majority) => None,
            Some(Acknowledgment::Nodes(nodes)) => Some(nodes.to_string()),
            Some(Acknowledgment::Custom(tag)) => Some(tag.clone()),
            Some(other) => Some(format!("{other:?}")),
        };
        if let Some(asked) = asked {
            return Err(less_durable(
                &format!("w={asked}"),
                "w=majority: a write acknowledged by fewer nodes can be rolled back by an \
                 election",
            ));
        }
        if concern.journal == Some(false) {
            return Err(less_durable(
                "journal=false",
                "journaled writes: a write acknowledged before the journal can be lost in a \
                 crash",
            ));
        }
    }
    if let Some(concern) = &options.read_concern {
        let asked = match &concern.level {
            ReadConcernLevel::Majority => None,
            ReadConcernLevel::Local => Some("local"),
            ReadConcernLevel::Available => Some("available"),
            ReadConcernLevel::Linearizable => Some("linearizable"),
            ReadConcernLevel::Snapshot => Some("snapshot"),
            ReadConcernLevel::Custom(level) => Some(level.as_str()),
            _ => Some("another level"),
        };
        if let Some(asked) = asked {
            return Err(less_durable(
                &format!("readConcernLevel={asked}"),
                "readConcernLevel=majority, which every read is pinned to: an answer must \
                 not rest on a write a failover can roll back",
            ));
        }
    }
    if let Some(criteria) = &options.selection_criteria {
        let asked = match criteria {
            SelectionCriteria::ReadPreference(ReadPreference::Primary) => None,
            SelectionCriteria::ReadPreference(ReadPreference::PrimaryPreferred { .. }) => {
                Some("primaryPreferred")
            }
            SelectionCriteria::ReadPreference(ReadPreference::Secondary { .. }) => {
                Some("secondary")
            }
            SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred { .. }) => {
                Some("secondaryPreferred")
            }
            SelectionCriteria::ReadPreference(ReadPreference::Nearest { .. }) => Some("nearest"),
            _ => Some("a server predicate"),
        };
        if let Some(asked) = asked {
            return Err(less_durable(
                &format!("readPreference={asked}"),
                "readPreference=primary: a lagging secondary must not decide an answer",
            ));
        }
    }
    let wtimeout = options.write_concern.as_ref().and_then(|c| c.w_timeout);
    options.write_concern = Some(durable_writes(wtimeout));
    options.read_concern = Some(ReadConcern::majority());
    options.selection_criteria = Some(SelectionCriteria::ReadPreference(ReadPreference::Primary));
    Ok(())
}

fn less_durable(asked: &str, needed: &str) -> ConnectError {
    ConnectError::LessDurable(format!(
        "asks for {asked}: tokenmint needs {needed} (remove the option)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pinned(uri: &str) -> Result<ClientOptions, ConnectError> {
        let mut options = ClientOptions::parse(uri).await?;
        pin_durability(&mut options)?;
        Ok(options)
    }

    #[tokio::test]
    async fn a_uri_saying_nothing_or_enough_is_pinned_and_keeps_its_wtimeout() {
        for uri in [
            "mongodb://127.0.0.1:1/?directConnection=true&appName=x",
            "mongodb://127.0.0.1:1/?w=majority&journal=true&readConcernLevel=majority&readPreference=primary",
        ] {
            let options = pinned(uri).await.expect("accepted");
            let writes = options.write_concern.unwrap();
            assert_eq!(writes.w, Some(Acknowledgment::Majority), "{uri}");
            assert_eq!(writes.journal, Some(true), "{uri}");
            assert_eq!(writes.w_timeout, None, "{uri}");
            assert_eq!(
                options.read_concern.unwrap().level,
                ReadConcernLevel::Majority
            );
            assert!(matches!(
                options.selection_criteria,
                Some(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            ));
        }
        let options = pinned("mongodb://127.0.0.1:1/?wtimeoutMS=2500")
            .await
            .unwrap();
        assert_eq!(
            options.write_concern.unwrap().w_timeout,
            Some(std::time::Duration::from_millis(2500))
        );
    }

    #[tokio::test]
    async fn a_command_written_by_hand_carries_the_pinned_concern_and_the_uris_wtimeout() {
        let options = pinned("mongodb://127.0.0.1:1/?wtimeoutMS=2500")
            .await
            .unwrap();
        let db = mongodb::Client::with_options(options)
            .unwrap()
            .database("x");
        let concern = pinned_command_writes(&db).to_document().unwrap();
        assert_eq!(concern.get_str("w"), Ok("majority"), "{concern}");
        assert_eq!(concern.get_bool("j"), Ok(true), "{concern}");
        let wtimeout = concern.get("wtimeout").and_then(|v| match v {
            mongodb::bson::Bson::Int32(ms) => Some(i64::from(*ms)),
            mongodb::bson::Bson::Int64(ms) => Some(*ms),
            _ => None,
        });
        assert_eq!(wtimeout, Some(2500), "{concern}");
    }

    #[test]
    fn a_write_is_covered_by_a_later_one_of_the_same_term_only() {
        let at = |term, time| OpTime {
            term,
            ts: Timestamp { time, increment: 0 },
        };
        assert!(at(5, 10).covered_by(&at(5, 10)));
        assert!(at(5, 10).covered_by(&at(5, 11)));
        assert!(!at(5, 10).covered_by(&at(5, 9)));
        assert!(!at(5, 10).covered_by(&at(6, 11)));
        assert!(!at(5, 10).covered_by(&at(4, 11)));
    }

    #[tokio::test]
    async fn less_is_refused_naming_the_option_and_never_the_uri() {
        let err = pinned("mongodb://user:S3cret@127.0.0.1:1/?readPreference=secondary")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("`mongo.uri` asks for readPreference=secondary"),
            "{err}"
        );
        assert!(
            !err.contains("S3cret") && !err.contains("127.0.0.1"),
            "{err}"
        );
        let err = pinned("mongodb://127.0.0.1:1/?readConcernLevel=linearizable")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("readConcernLevel=linearizable"), "{err}");
    }
}
