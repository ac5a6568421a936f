//! Atomic mode, the same in both floor designs: the issuance record and its tokens in one
//! transaction per request, with the per-request design's write concern. Apart from the
//! upsert designs because it shares nothing with them but the replay.

use std::time::{Duration, Instant};

use mongodb::ClientSession;
use mongodb::bson::{DateTime, RawDocumentBuf, oid::ObjectId};
use mongodb::error::{Error, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{Acknowledgment, ReadConcern, WriteConcern};
use tokenmint::domain::{IssuanceStatus, NewIssuance};
use tokenmint::store::builders::{MAX_TRANSACTION_ATTEMPTS, issuance_filter, new_token};
use tokenmint::store::{
    ISSUANCES_PAYMENT_INDEX, IssuanceDoc, TOKENS, duplicate_key_index, fresh_tokens,
};

use super::Floor;
use crate::op_times::{Op, OpTimes};
use crate::workload::Outcome;

/// How often a commit whose result is unknown is retried before its error counts.
const COMMIT_RETRIES: u32 = 3;

impl Floor {
    /// One transaction per attempt (the record and the tokens), on a session per request;
    /// a duplicate key on the record index is a replay.
    pub(super) async fn issue_atomic(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let mut session = self.client.start_session().await?;
        times.record(Op::StartSession, started);
        let mut attempt = 1;
        loop {
            match self.try_transaction(&mut session, request, times).await {
                Ok(Some(created)) => return Ok(Outcome::ok(201, created)),
                Ok(None) => {
                    let started = Instant::now();
                    let record = self
                        .records()
                        .find_one(issuance_filter(&request.key))
                        .await?;
                    times.record(Op::ReadRecord, started);
                    let record =
                        record.ok_or_else(|| anyhow::anyhow!("issuance record vanished"))?;
                    return self.replay(request, record, times).await;
                }
                Err(err)
                    if err.contains_label(TRANSIENT_TRANSACTION_ERROR)
                        && attempt < MAX_TRANSACTION_ATTEMPTS =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 5)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// One attempt: `Some(created)` when committed, `None` when the record already exists.
    async fn try_transaction(
        &self,
        session: &mut ClientSession,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> Result<Option<u32>, Error> {
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).build())
            .await?;
        let record = IssuanceDoc::new(request, IssuanceStatus::Issuing);
        let started = Instant::now();
        let result = self
            .records()
            .insert_one(&record)
            .session(&mut *session)
            .await;
        times.record(Op::TxnInsertRecord, started);
        if let Err(err) = result {
            let _ = session.abort_transaction().await;
            if duplicate_key_index(&err).as_deref() == Some(ISSUANCES_PAYMENT_INDEX) {
                return Ok(None);
            }
            return Err(err);
        }
        let now = DateTime::now();
        let (tokens, inserted): (Vec<RawDocumentBuf>, Vec<(i64, ObjectId)>) =
            (0..i64::from(request.params.quantity.get()))
                .map(|token_index| {
                    let id = ObjectId::new();
                    let mut document = new_token(request, token_index, None, now);
                    document.append_ref("_id", id);
                    (document, (token_index, id))
                })
                .unzip();
        let started = Instant::now();
        let result = self
            .db
            .collection::<RawDocumentBuf>(TOKENS)
            .insert_many(tokens)
            .session(&mut *session)
            .await;
        times.record(Op::TxnInsertTokens, started);
        if let Err(err) = result {
            let _ = session.abort_transaction().await;
            return Err(err);
        }
        let started = Instant::now();
        let mut commit_attempt = 0;
        loop {
            match session.commit_transaction().await {
                Err(err)
                    if err.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                        && commit_attempt < COMMIT_RETRIES =>
                {
                    commit_attempt += 1
                }
                other => {
                    times.record(Op::TxnCommit, started);
                    other?;
                    break;
                }
            }
        }
        // The answer names the tokens it inserted, as `fresh_tokens` does.
        Ok(Some(fresh_tokens(inserted, None).len() as u32))
    }
}
