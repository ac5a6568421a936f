//! What every command tokenmint sends is pinned to, whatever `mongo.uri` or the server's
//! defaults say: writes acknowledged by a majority and journaled (an acknowledged redeem,
//! refund or issuance survives a failover), reads at read concern `majority` (an answer
//! never rests on a write a failover could roll back) and on the primary (a lagging
//! secondary never decides). A URI asking for less is refused rather than silently
//! overridden, so that what the operator wrote and what runs never disagree.
//!
//! Only an option's name and value are ever told, never the URI: it may carry credentials.

use mongodb::ClientSession;
use mongodb::options::{
    Acknowledgment, ClientOptions, ReadConcern, ReadConcernLevel, ReadPreference,
    SelectionCriteria, WriteConcern,
};

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

/// `durable_writes` as a command's `writeConcern`, for a command built by hand (which the
/// driver sends as written, without the client's write concern).
pub(super) fn durable_command_writes() -> mongodb::bson::RawDocumentBuf {
    mongodb::bson::rawdoc! { "w": "majority", "j": true }
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
