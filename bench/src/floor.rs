//! The database floors: MongoDB operations issued directly with the mongodb crate, without
//! HTTP and without tokenmint's issuing logic, on a database migrated with tokenmint's own
//! indexes. The documents, filters and commands, and the retry bounds, are the store's own
//! (`tokenmint::store::builders`), so the floors cannot drift from what the service writes.
//! Two designs are measured:
//!
//! - the per-request floor ([`Design::PerRequest`]): tokenmint's design before group
//!   commit, one request at a time — in upsert mode the issuance record claimed with a
//!   `findOneAndUpdate` upsert, then one unordered bulk of `$setOnInsert` token upserts; in
//!   atomic mode one transaction (record + tokens), with that design's write concern.
//!   tokenmint no longer performs exactly these operations (upsert mode is
//!   group-committed, and both modes now read the payment and mark the record issued), so
//!   this is a reference point, not a mirror;
//! - the reference floor ([`Design::Reference`]): the reference design's upsert floor,
//!   one unordered bulk of `$setOnInsert` upserts per issuance keyed by the token unique
//!   index, no issuance record, and a read-back only on a replay; in atomic mode the same
//!   transaction as the per-request floor.

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{DateTime, RawDocumentBuf, doc, oid::ObjectId};
use mongodb::error::{Error, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{Acknowledgment, ClientOptions, ReadConcern, ReturnDocument, WriteConcern};
use mongodb::{Client, ClientSession, Collection, Database};
use tokenmint::domain::{IssuanceMode, IssuanceStatus, NewIssuance};
use tokenmint::store::builders::{
    BulkFailure, MAX_TRANSACTION_ATTEMPTS, RECORD_RACE_RETRIES, bulk_command, first_failure,
    issuance_filter, new_token, payment_tokens_filter, upserted_ids,
};
use tokenmint::store::{
    ISSUANCES, ISSUANCES_PAYMENT_INDEX, IssuanceDoc, TOKENS, TokenSummary, chrono_time,
    duplicate_key_index, fresh_tokens,
};

use crate::op_times::{Op, OpTimes};
use crate::service_settings;
use crate::workload::{Outcome, Payment, new_issuance};

/// Which floor a [`Floor`] issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// tokenmint's per-request design before group commit.
    PerRequest,
    /// The reference design's upsert floor: one unordered bulk of `$setOnInsert` upserts per
    /// issuance, no issuance record.
    Reference,
}

impl Design {
    pub const ALL: [Design; 2] = [Design::PerRequest, Design::Reference];

    /// The target's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Design::PerRequest => "floor",
            Design::Reference => "reference floor",
        }
    }
}

/// A connection to one floor's own database, with tokenmint's indexes.
#[derive(Clone)]
pub struct Floor {
    client: Client,
    db: Database,
    design: Design,
    /// The service's `issuance.duplicate_key_retries`.
    duplicate_key_retries: u32,
}

impl Floor {
    /// Connects with the service's default settings (pool size, timeouts) and applies
    /// tokenmint's migrations to `database`, so the indexes are the service's own.
    pub async fn connect(
        uri: &str,
        database: &str,
        max_pool_size: u32,
        design: Design,
    ) -> anyhow::Result<Self> {
        let settings = service_settings(uri, database, max_pool_size)?;
        let (store, _) = tokenmint::startup::connect(&settings).await?;
        tokenmint::migrate::run(&store, false).await?;
        store.shutdown().await;

        let timeout = settings.server_selection_timeout();
        let mut options = ClientOptions::parse(uri).await?;
        let app_name = match design {
            Design::PerRequest => "tokenmint-bench-floor",
            Design::Reference => "tokenmint-bench-reference-floor",
        };
        options.app_name = Some(app_name.to_owned());
        options.server_selection_timeout = Some(timeout);
        options.connect_timeout = Some(timeout);
        options.max_pool_size = Some(max_pool_size);
        let client = Client::with_options(options)?;
        let db = client.database(database);
        Ok(Self {
            client,
            db,
            design,
            duplicate_key_retries: settings.issuance.duplicate_key_retries,
        })
    }

    pub fn design(&self) -> Design {
        self.design
    }

    pub async fn shutdown(self) {
        self.client.shutdown().await;
    }

    /// `issuances`, decoded straight into `IssuanceDoc` (as `Store::records`).
    fn records(&self) -> Collection<IssuanceDoc> {
        self.db.collection(ISSUANCES)
    }

    /// One issuance, as this floor's design performs it. Both designs share atomic mode.
    pub async fn issue(
        &self,
        payment: &Payment,
        mode: IssuanceMode,
        times: &mut OpTimes,
    ) -> Outcome {
        let request = match new_issuance(payment, mode) {
            Ok(request) => request,
            Err(err) => return Outcome::error(422, err),
        };
        let result = match (mode, self.design) {
            (IssuanceMode::Upsert, Design::PerRequest) => self.issue_upsert(&request, times).await,
            (IssuanceMode::Upsert, Design::Reference) => {
                self.issue_reference_upsert(&request, times).await
            }
            (IssuanceMode::Atomic, _) => self.issue_atomic(&request, times).await,
        };
        match result {
            Ok(outcome) => outcome,
            Err(err) => Outcome::error(500, err.to_string()),
        }
    }

    /// The per-request design's upsert mode: claim the record (a `findOneAndUpdate`
    /// upsert), then the token bulk; a record that existed already makes it a replay.
    async fn issue_upsert(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let record = IssuanceDoc::new(request, IssuanceStatus::Issuing);
        let mut attempt = 0;
        let existing = loop {
            let started = Instant::now();
            let result = self
                .records()
                .find_one_and_update(
                    issuance_filter(&request.key),
                    doc! { "$setOnInsert": mongodb::bson::to_document(&record)? },
                )
                .upsert(true)
                .return_document(ReturnDocument::Before)
                .await;
            times.record(Op::ClaimRecord, started);
            match result {
                Ok(existing) => break existing,
                Err(err)
                    if attempt < RECORD_RACE_RETRIES
                        && duplicate_key_index(&err).as_deref()
                            == Some(ISSUANCES_PAYMENT_INDEX) =>
                {
                    attempt += 1
                }
                Err(err) => return Err(err.into()),
            }
        };
        match existing {
            None => {
                let inserted = self.upsert_tokens(request, times).await?;
                let created = inserted.len() as u32;
                // Built as the service builds its answer, though only the count is used.
                let _tokens = if created == request.params.quantity.get() {
                    fresh_tokens(inserted)
                } else {
                    self.payment_tokens(request, times).await?
                };
                Ok(Outcome::ok(201, created))
            }
            Some(existing) => self.replay(request, existing, times).await,
        }
    }

    /// The reference design's upsert mode: the tokens alone, one unordered bulk of
    /// `$setOnInsert` upserts whose filter is the token unique key (re-run on a duplicate
    /// key of that index). When it upserted every token the answer names them without a
    /// read; otherwise the payment was issued before (a replay, or a race) and its tokens
    /// are read back and verified: all of them there, with this owner and type, or 409.
    async fn issue_reference_upsert(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let inserted = self.upsert_tokens(request, times).await?;
        let created = inserted.len() as u32;
        let quantity = request.params.quantity.get();
        if created == quantity {
            let _tokens = fresh_tokens(inserted);
            return Ok(Outcome::ok(201, created));
        }
        let started = Instant::now();
        let tokens: Vec<RawDocumentBuf> = self
            .db
            .collection::<RawDocumentBuf>(TOKENS)
            .find(payment_tokens_filter(&request.key))
            .projection(doc! {
                "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1, "owner": 1, "type": 1,
            })
            .sort(doc! { "tokenIndex": 1 })
            .await?
            .try_collect()
            .await?;
        times.record(Op::VerifyTokens, started);
        let owner = request.params.owner.object_id();
        let matches = tokens.len() == quantity as usize
            && tokens.iter().all(|token| {
                token.get_object_id("owner").ok() == Some(owner)
                    && token.get_str("type").ok() == Some(request.params.token_type.as_str())
            });
        Ok(Outcome::ok(if matches { 200 } else { 409 }, created))
    }

    /// A replay in the per-request design (and in either floor's atomic mode): verify
    /// against the record, read the tokens, complete a partial set with the recorded date.
    async fn replay(
        &self,
        request: &NewIssuance,
        existing: IssuanceDoc,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        if existing.owner != request.params.owner.object_id()
            || existing.token_type != request.params.token_type.as_str()
            || existing.quantity != i64::from(request.params.quantity.get())
        {
            return Ok(Outcome::ok(409, 0));
        }
        let tokens = self.payment_tokens(request, times).await?;
        let mut created = 0;
        if tokens.len() < existing.quantity as usize {
            let recorded = NewIssuance {
                payment_date: chrono_time(existing.payment_date),
                ..request.clone()
            };
            created = self.upsert_tokens(&recorded, times).await?.len() as u32;
            self.payment_tokens(request, times).await?;
        }
        Ok(Outcome::ok(200, created))
    }

    /// `Store::upsert_tokens`: the store's `update` command, re-run on a duplicate key of
    /// the token index (bounded as the service bounds it).
    async fn upsert_tokens(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Vec<(i64, ObjectId)>> {
        let command = bulk_command(request, DateTime::now());
        let mut inserted = Vec::new();
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            let reply = self.db.run_raw_command(command.clone()).await;
            times.record(Op::TokenBulk, started);
            let reply = reply?;
            inserted.extend(upserted_ids(&reply)?);
            match first_failure(&reply) {
                None => return Ok(inserted),
                Some(BulkFailure::TokenRace) if attempt < self.duplicate_key_retries => {
                    attempt += 1
                }
                Some(BulkFailure::TokenRace) => {
                    anyhow::bail!("token upsert kept racing past its retry budget")
                }
                Some(BulkFailure::Unavailable(message) | BulkFailure::Other(message)) => {
                    anyhow::bail!(message)
                }
            }
        }
    }

    /// `Store::payment_tokens`: the payment's token summaries, in tokenIndex order.
    async fn payment_tokens(
        &self,
        request: &NewIssuance,
        times: &mut OpTimes,
    ) -> anyhow::Result<Vec<TokenSummary>> {
        let started = Instant::now();
        let cursor = self
            .db
            .collection::<TokenSummary>(TOKENS)
            .find(payment_tokens_filter(&request.key))
            .projection(doc! { "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1 })
            .sort(doc! { "tokenIndex": 1 })
            .await?;
        let tokens: Vec<TokenSummary> = cursor.try_collect().await?;
        times.record(Op::ReadTokens, started);
        Ok(tokens)
    }

    /// Atomic mode, in both designs: one transaction per attempt (the record and the
    /// tokens), on a session per request; a duplicate key on the record index is a replay.
    async fn issue_atomic(
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
                    let mut document = new_token(request, token_index, now);
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
                        && commit_attempt < 3 =>
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
        Ok(Some(fresh_tokens(inserted).len() as u32))
    }
}
