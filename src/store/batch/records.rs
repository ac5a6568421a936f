//! A batch's records in one `insert` command written by hand, for its `maxTimeMS` (the
//! driver's `insert_many` sends none): a record whose payment's key another transaction
//! holds (one a killed instance left open, which the server aborts only at the end of its
//! lifetime) makes the server retry that write until the key is free, and in one command
//! every record of the batch would wait with it. Past the limit the records go in one by
//! one, a few at a time, each with the same limit: only the held one fails.
//!
//! On a replica set the records are acknowledged by the primary alone (`w: 1`), like the
//! tokens after them (`tokens`), exceptions to the client's pinned majority
//! (`durability`). Nothing answers from a record before the batch's `w: majority` mark,
//! which can only find the record on a node that has it, and whose majority commit point
//! covers everything before it in that node's oplog; a read at majority before then does
//! not see the record, and the writes that decide on it (claim, upsert) do. On a sharded
//! cluster the record and the mark may live on different shards, so records are written
//! with the majority there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{RawArrayBuf, doc, rawdoc};
use mongodb::error::Error;
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria};

use super::{RecordInsert, WriteReply, code_error, write_concern_failure};
use crate::store::documents::IssuanceDoc;
use crate::store::durability::pinned_command_writes;
use crate::store::error::{ISSUANCES_PAYMENT_INDEX, StoreError, command_code, index_in_message};
use crate::store::{ISSUANCES, Store};

/// How long the server may run a records insert (`maxTimeMS`). A full batch of records
/// takes milliseconds; one that runs this long is waiting on a held key. The server must
/// be the one to stop: with the client gone, an abandoned insert kept waiting there, and
/// the service's `w: majority` token inserts stalled with it (seen in the stuck-payment
/// test before this limit).
const PATIENCE: Duration = Duration::from_millis(1500);

/// Records inserted alone at once, after a batch's insert ran out of time: bounds what
/// one held-up batch takes of the connection pool.
const ALONE_AT_ONCE: usize = 16;

/// Inserts alone that may run out of time before the rest give up: one held key explains
/// one, a few concurrent orphans a few; more mean the database is slow for everyone, and
/// waiting `PATIENCE` for each would only hold the batch's requests longer.
const ALONE_OUT_OF_TIME_LIMIT: usize = 3;

/// Codes of a command stopped before it finished: MaxTimeMSExpired, and Interrupted (an
/// operator who killed the held-up insert, say). Some records may be written, some not.
const STOPPED_CODES: [i32; 2] = [50, 11601];

/// Why a records command did not report per record.
enum RecordsCommand {
    /// Stopped before it finished (`STOPPED_CODES`).
    Stopped,
    /// Failed as a whole.
    Failed(StoreError),
}

impl From<StoreError> for RecordsCommand {
    fn from(err: StoreError) -> Self {
        RecordsCommand::Failed(err)
    }
}

impl Store {
    /// Inserts `records` in one unordered command; if the server stops it, one by one
    /// (`insert_record_alone`), so that a record whose key another transaction holds
    /// fails alone (`Contended`) and the others go on.
    pub async fn insert_records(
        &self,
        records: &[IssuanceDoc],
    ) -> Result<Vec<RecordInsert>, StoreError> {
        match self.insert_records_command(records).await {
            Ok(inserted) => Ok(inserted),
            Err(RecordsCommand::Failed(err)) => Err(err),
            Err(RecordsCommand::Stopped) => {
                tracing::warn!(
                    records = records.len(),
                    "a batch's record insert was stopped; inserting its records one by one"
                );
                let out_of_time = AtomicUsize::new(0);
                let out_of_time = &out_of_time;
                // Made before they are streamed: a closure in the stream would make the
                // writer task's future not provably `Send`.
                let alone: Vec<_> = records
                    .iter()
                    .map(|record| self.insert_record_alone(record, out_of_time))
                    .collect();
                Ok(futures::stream::iter(alone)
                    .buffered(ALONE_AT_ONCE)
                    .collect()
                    .await)
            }
        }
    }

    /// `records_command`, sent again once when it fails for unavailability: unlike the
    /// driver's own writes it is not retried by the driver, and sending it again is safe
    /// (a record it wrote already comes back as a duplicate of its own `_id`).
    async fn insert_records_command(
        &self,
        records: &[IssuanceDoc],
    ) -> Result<Vec<RecordInsert>, RecordsCommand> {
        match self.records_command(records).await {
            Err(RecordsCommand::Failed(StoreError::Unavailable(_))) => {
                self.records_command(records).await
            }
            outcome => outcome,
        }
    }

    /// One `insert` command of `records`, unordered, stopped by the server after
    /// `PATIENCE`.
    async fn records_command(
        &self,
        records: &[IssuanceDoc],
    ) -> Result<Vec<RecordInsert>, RecordsCommand> {
        let write_concern = if self.is_sharded().await? {
            pinned_command_writes(&self.db)
        } else {
            rawdoc! { "w": 1, "j": false }
        };
        let documents = records
            .iter()
            .map(mongodb::bson::to_raw_document_buf)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| StoreError::Internal(format!("cannot encode a record: {err}")))?;
        let mut command = rawdoc! {
            "insert": ISSUANCES,
            "ordered": false,
            "maxTimeMS": PATIENCE.as_millis() as i64,
            "writeConcern": write_concern,
        };
        command.append("documents", RawArrayBuf::from_iter(documents));
        let reply = match self.db.run_raw_command(command).await {
            Ok(reply) => reply,
            Err(err) if command_code(&err).is_some_and(|code| STOPPED_CODES.contains(&code)) => {
                return Err(RecordsCommand::Stopped);
            }
            Err(err) => return Err(RecordsCommand::Failed(err.into())),
        };
        let reply: WriteReply = mongodb::bson::from_document(reply)
            .map_err(|err| StoreError::Internal(format!("unexpected insert reply: {err}")))?;
        per_record(reply, records.len())
    }

    /// One record of a batch whose insert was stopped. That command may have written this
    /// record before it stopped (with the same `_id`), so a duplicate key is this record's
    /// own write unless the record under that key has another `_id`. Once
    /// `ALONE_OUT_OF_TIME_LIMIT` of a batch's records ran out of time, the rest give up.
    async fn insert_record_alone(
        &self,
        record: &IssuanceDoc,
        out_of_time: &AtomicUsize,
    ) -> RecordInsert {
        if out_of_time.load(Ordering::Relaxed) >= ALONE_OUT_OF_TIME_LIMIT {
            return RecordInsert::Failed(StoreError::unavailable(
                "record inserts keep running out of time",
            ));
        }
        let inserted = match self
            .insert_records_command(std::slice::from_ref(record))
            .await
        {
            Ok(mut inserted) => inserted.pop().unwrap_or(RecordInsert::Inserted),
            Err(RecordsCommand::Failed(err)) => RecordInsert::Failed(err),
            Err(RecordsCommand::Stopped) => {
                out_of_time.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(payment = %record.payment_intent_id, "an issuance record's key stayed held");
                return RecordInsert::Failed(StoreError::Contended(Error::custom(
                    "the payment's record key stayed held by another transaction",
                )));
            }
        };
        if !matches!(inserted, RecordInsert::Exists) {
            return inserted;
        }
        // Read locally on the primary: the first command's write is acknowledged by the
        // primary alone, and the batch's mark that follows makes it majority.
        let ours = self
            .records()
            .find_one(doc! { "_id": record.id })
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .read_concern(ReadConcern::local())
            .await;
        match ours {
            Ok(Some(_)) => RecordInsert::Inserted,
            Ok(None) => RecordInsert::Exists,
            Err(err) => RecordInsert::Failed(err.into()),
        }
    }
}

/// Each record's result from an `insert` reply of `count` records.
fn per_record(reply: WriteReply, count: usize) -> Result<Vec<RecordInsert>, RecordsCommand> {
    if let Some(wce) = reply.write_concern_error {
        return Err(RecordsCommand::Failed(write_concern_failure(wce.code)));
    }
    let mut results: Vec<RecordInsert> = (0..count).map(|_| RecordInsert::Inserted).collect();
    for error in reply.write_errors {
        if STOPPED_CODES.contains(&error.code) {
            return Err(RecordsCommand::Stopped);
        }
        let duplicate_on = (error.code == 11000)
            .then(|| index_in_message(&error.errmsg))
            .flatten();
        let Some(slot) = results.get_mut(error.index) else {
            return Err(RecordsCommand::Failed(StoreError::Internal(format!(
                "an insert reply names record {} of {count}",
                error.index
            ))));
        };
        *slot = match duplicate_on.as_deref() {
            Some(ISSUANCES_PAYMENT_INDEX) => RecordInsert::Exists,
            // Its `_id` is new, chosen here: a command stopped or sent again wrote it.
            Some("_id_") => RecordInsert::Inserted,
            _ => RecordInsert::Failed(code_error(error.code)),
        };
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(value: mongodb::bson::Document) -> WriteReply {
        mongodb::bson::from_document(value).unwrap()
    }

    fn kinds(results: Vec<RecordInsert>) -> Vec<&'static str> {
        results
            .iter()
            .map(|r| match r {
                RecordInsert::Inserted => "inserted",
                RecordInsert::Exists => "exists",
                RecordInsert::Failed(StoreError::Unavailable(_)) => "unavailable",
                RecordInsert::Failed(_) => "failed",
            })
            .collect()
    }

    #[test]
    fn each_record_is_judged_by_its_own_write_error() {
        let payment_dup =
            format!("E11000 duplicate key error index: {ISSUANCES_PAYMENT_INDEX} dup key: {{}}");
        let results = per_record(
            reply(doc! { "ok": 1, "n": 1, "writeErrors": [
                { "index": 1, "code": 11000, "errmsg": payment_dup },
                { "index": 2, "code": 11000, "errmsg": "E11000 duplicate key error index: _id_ dup key: {}" },
                { "index": 3, "code": 10107, "errmsg": "not primary" },
                { "index": 4, "code": 2, "errmsg": "bad value" },
                { "index": 5, "code": 89, "errmsg": "a router's network timeout" },
            ] }),
            6,
        );
        let Ok(results) = results else {
            panic!("per record")
        };
        assert_eq!(
            kinds(results),
            [
                "inserted",
                "exists",
                "inserted",
                "unavailable",
                "failed",
                "unavailable"
            ]
        );
    }

    #[test]
    fn a_stopped_or_unconfirmed_command_reports_no_record() {
        for stopped in [50, 11601] {
            let outcome = per_record(
                reply(
                    doc! { "ok": 1, "writeErrors": [{ "index": 0, "code": stopped, "errmsg": "" }] },
                ),
                2,
            );
            assert!(matches!(outcome, Err(RecordsCommand::Stopped)), "{stopped}");
        }
        for not_in_time in [50, 64, 10107] {
            let outcome = per_record(
                reply(doc! { "ok": 1, "writeConcernError": { "code": not_in_time, "errmsg": "" } }),
                2,
            );
            assert!(
                matches!(
                    outcome,
                    Err(RecordsCommand::Failed(StoreError::Unavailable(_)))
                ),
                "{not_in_time}"
            );
        }
        let stray = per_record(
            reply(doc! { "ok": 1, "writeErrors": [{ "index": 7, "code": 11000, "errmsg": "" }] }),
            2,
        );
        assert!(matches!(
            stray,
            Err(RecordsCommand::Failed(StoreError::Internal(_)))
        ));
    }
}
