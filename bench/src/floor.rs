//! The database floors: MongoDB operations issued directly with the mongodb crate, without
//! HTTP and without tokenmint's code, on a database migrated with tokenmint's own indexes.
//! Two designs are measured:
//!
//! - the per-request floor ([`Design::PerRequest`]): tokenmint's design before group
//!   commit, one request at a time — in upsert mode the issuance record claimed with a
//!   `findOneAndUpdate` upsert, then one unordered bulk of `$setOnInsert` token upserts; in
//!   atomic mode one transaction (record + tokens). Same filters, documents, write concern
//!   and retries as that design had. tokenmint no longer performs exactly these operations
//!   (upsert mode is group-committed, and both modes now read the payment and mark the
//!   record issued), so this is a reference point, not a mirror;
//! - the seed floor ([`Design::Seed`]): the seed design's upsert floor, one unordered bulk
//!   of `$setOnInsert` upserts per issuance keyed by the token unique index, no issuance
//!   record, and a read-back only on a replay; in atomic mode the same transaction as the
//!   per-request floor.

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use hdrhistogram::Histogram;
use mongodb::bson::{
    self, Bson, DateTime, Document, RawArrayBuf, RawDocumentBuf, doc, oid::ObjectId, rawdoc,
};
use mongodb::error::{Error, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{Acknowledgment, ClientOptions, ReadConcern, ReturnDocument, WriteConcern};
use mongodb::{Client, ClientSession, Collection, Database};
use tokenmint::domain::{IssuanceMode, IssuanceStatus};
use tokenmint::store::{
    ISSUANCES_PAYMENT_INDEX, IssuanceDoc, TOKENS_PAYMENT_INDEX, TokenSummary, duplicate_key_index,
};

use crate::workload::{Outcome, Payment};

const ISSUANCES: &str = "issuances";
const TOKENS: &str = "tokens";
/// src/store/issuance.rs RECORD_RACE_RETRIES.
const RECORD_RACE_RETRIES: u32 = 3;
/// config/default.toml issuance.duplicate_key_retries.
const DUPLICATE_KEY_RETRIES: u32 = 3;
/// src/store/atomic.rs MAX_TRANSACTION_ATTEMPTS.
const MAX_TRANSACTION_ATTEMPTS: u32 = 10;

/// Which floor a [`Floor`] issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// tokenmint's per-request design before group commit.
    PerRequest,
    /// The seed design's upsert floor: one unordered bulk of `$setOnInsert` upserts per
    /// issuance, no issuance record.
    Seed,
}

impl Design {
    pub const ALL: [Design; 2] = [Design::PerRequest, Design::Seed];

    /// The target's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Design::PerRequest => "floor",
            Design::Seed => "seed floor",
        }
    }
}

/// The database operations a floor issuance is made of, timed separately so that the
/// report can say where the database spends its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    ClaimRecord,
    TokenBulk,
    ReadTokens,
    VerifyTokens,
    StartSession,
    TxnInsertRecord,
    TxnInsertTokens,
    TxnCommit,
    ReadRecord,
}

impl Op {
    pub const ALL: [Op; 9] = [
        Op::ClaimRecord,
        Op::TokenBulk,
        Op::ReadTokens,
        Op::VerifyTokens,
        Op::StartSession,
        Op::TxnInsertRecord,
        Op::TxnInsertTokens,
        Op::TxnCommit,
        Op::ReadRecord,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::ClaimRecord => "findOneAndUpdate issuances (upsert, $setOnInsert)",
            Op::TokenBulk => "update tokens (N upserts, unordered, w:majority)",
            Op::ReadTokens => "find tokens (sorted, projected)",
            Op::VerifyTokens => "find tokens (sorted, with owner and type to verify a replay)",
            Op::StartSession => "startSession",
            Op::TxnInsertRecord => "txn insert issuances",
            Op::TxnInsertTokens => "txn insertMany tokens",
            Op::TxnCommit => "commitTransaction (w:majority)",
            Op::ReadRecord => "findOne issuances",
        }
    }
}

/// Latency of each database operation, in microseconds.
pub struct OpTimes {
    pub hists: Vec<Histogram<u64>>,
}

impl Default for OpTimes {
    fn default() -> Self {
        Self {
            hists: Op::ALL
                .iter()
                .map(|_| crate::workload::new_histogram())
                .collect(),
        }
    }
}

impl OpTimes {
    fn record(&mut self, op: Op, started: Instant) {
        let index = Op::ALL.iter().position(|o| *o == op).unwrap_or(0);
        let _ = self.hists[index].record(crate::workload::micros(started.elapsed()));
    }

    pub fn add(&mut self, other: &OpTimes) {
        for (mine, theirs) in self.hists.iter_mut().zip(&other.hists) {
            let _ = mine.add(theirs);
        }
    }
}

/// A connection to one floor's own database, with tokenmint's indexes.
#[derive(Clone)]
pub struct Floor {
    client: Client,
    db: Database,
    design: Design,
}

impl Floor {
    /// Connects like `Store::connect` (same pool size and timeouts) and applies
    /// tokenmint's migrations to `database`, so the indexes are the service's own.
    pub async fn connect(
        uri: &str,
        database: &str,
        max_pool_size: u32,
        design: Design,
    ) -> anyhow::Result<Self> {
        let timeout = Duration::from_millis(2000);
        let store = tokenmint::store::Store::connect(
            uri,
            database,
            timeout,
            max_pool_size,
            tokenmint::store::StoreConfig::default(),
        )
        .await?;
        tokenmint::migrate::run(&store, false).await?;
        store.shutdown().await;

        let mut options = ClientOptions::parse(uri).await?;
        let app_name = match design {
            Design::PerRequest => "tokenmint-bench-floor",
            Design::Seed => "tokenmint-bench-seed-floor",
        };
        options.app_name = Some(app_name.to_owned());
        options.server_selection_timeout = Some(timeout);
        options.connect_timeout = Some(timeout);
        options.max_pool_size = Some(max_pool_size);
        let client = Client::with_options(options)?;
        let db = client.database(database);
        Ok(Self { client, db, design })
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
        let result = match (mode, self.design) {
            (IssuanceMode::Upsert, Design::PerRequest) => self.issue_upsert(payment, times).await,
            (IssuanceMode::Upsert, Design::Seed) => self.issue_seed_upsert(payment, times).await,
            (IssuanceMode::Atomic, _) => self.issue_atomic(payment, times).await,
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
        payment: &Payment,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let record_view = new_record_view(payment, IssuanceMode::Upsert);
        let mut attempt = 0;
        let existing = loop {
            let started = Instant::now();
            let result = self
                .records()
                .find_one_and_update(
                    issuance_filter(payment, RECORD_KEY_FIELDS),
                    doc! { "$setOnInsert": bson::to_document(&record_view)? },
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
                let inserted = self.upsert_tokens(payment, payment.date, times).await?;
                let created = inserted.len() as u32;
                // Built as the service builds its answer, though only the count is used.
                let _tokens = if inserted.len() == payment.quantity as usize {
                    fresh_tokens(inserted)
                } else {
                    self.payment_tokens(payment, times).await?
                };
                Ok(Outcome::ok(201, created))
            }
            Some(existing) => self.replay(payment, existing, times).await,
        }
    }

    /// The seed design's upsert mode: the tokens alone, one unordered bulk of
    /// `$setOnInsert` upserts whose filter is the token unique key (re-run on a duplicate
    /// key of that index). When it upserted every token the answer names them without a
    /// read; otherwise the payment was issued before (a replay, or a race) and its tokens
    /// are read back and verified: all of them there, with this owner and type, or 409.
    async fn issue_seed_upsert(
        &self,
        payment: &Payment,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let inserted = self.upsert_tokens(payment, payment.date, times).await?;
        let created = inserted.len() as u32;
        if created == payment.quantity {
            let _tokens = fresh_tokens(inserted);
            return Ok(Outcome::ok(201, created));
        }
        let started = Instant::now();
        let tokens: Vec<RawDocumentBuf> = self
            .db
            .collection::<RawDocumentBuf>(TOKENS)
            .find(issuance_filter(payment, TOKEN_KEY_FIELDS))
            .projection(doc! {
                "_id": 1, "tokenIndex": 1, "status": 1, "_version": 1, "owner": 1, "type": 1,
            })
            .sort(doc! { "tokenIndex": 1 })
            .await?
            .try_collect()
            .await?;
        times.record(Op::VerifyTokens, started);
        let matches = tokens.len() == payment.quantity as usize
            && tokens.iter().all(|token| {
                token.get_object_id("owner").ok() == Some(payment.owner)
                    && token.get_str("type").ok() == Some(payment.token_type)
            });
        Ok(Outcome::ok(if matches { 200 } else { 409 }, created))
    }

    /// A replay in the per-request design (and in either floor's atomic mode): verify
    /// against the record, read the tokens, complete a partial set.
    async fn replay(
        &self,
        payment: &Payment,
        existing: IssuanceDoc,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        if existing.owner != payment.owner
            || existing.token_type != payment.token_type
            || existing.quantity != i64::from(payment.quantity)
        {
            return Ok(Outcome::ok(409, 0));
        }
        let tokens = self.payment_tokens(payment, times).await?;
        let mut created = 0;
        if tokens.len() < existing.quantity as usize {
            created = self
                .upsert_tokens(payment, existing.payment_date, times)
                .await?
                .len() as u32;
            self.payment_tokens(payment, times).await?;
        }
        Ok(Outcome::ok(200, created))
    }

    /// `Store::upsert_tokens`: one unordered `update` with an upsert per token, re-run on a
    /// duplicate key of the token index (bounded).
    async fn upsert_tokens(
        &self,
        payment: &Payment,
        date: DateTime,
        times: &mut OpTimes,
    ) -> anyhow::Result<Vec<(i64, ObjectId)>> {
        let command = bulk_command(payment, date, DateTime::now());
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
                Some(Ok(())) if attempt < DUPLICATE_KEY_RETRIES => attempt += 1,
                Some(Ok(())) => anyhow::bail!("token upsert kept racing past its retry budget"),
                Some(Err(message)) => anyhow::bail!(message),
            }
        }
    }

    /// `Store::payment_tokens`: the payment's token summaries, in tokenIndex order.
    async fn payment_tokens(
        &self,
        payment: &Payment,
        times: &mut OpTimes,
    ) -> anyhow::Result<Vec<TokenSummary>> {
        let started = Instant::now();
        let cursor = self
            .db
            .collection::<TokenSummary>(TOKENS)
            .find(issuance_filter(payment, TOKEN_KEY_FIELDS))
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
        payment: &Payment,
        times: &mut OpTimes,
    ) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let mut session = self.client.start_session().await?;
        times.record(Op::StartSession, started);
        let mut attempt = 1;
        loop {
            match self.try_transaction(&mut session, payment, times).await {
                Ok(Some(created)) => return Ok(Outcome::ok(201, created)),
                Ok(None) => {
                    let started = Instant::now();
                    let record = self
                        .records()
                        .find_one(issuance_filter(payment, RECORD_KEY_FIELDS))
                        .await?;
                    times.record(Op::ReadRecord, started);
                    let record =
                        record.ok_or_else(|| anyhow::anyhow!("issuance record vanished"))?;
                    return self.replay(payment, record, times).await;
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
        payment: &Payment,
        times: &mut OpTimes,
    ) -> Result<Option<u32>, Error> {
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).build())
            .await?;
        let record_view = new_record_view(payment, IssuanceMode::Atomic);
        let started = Instant::now();
        let result = self
            .records()
            .insert_one(&record_view)
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
            (0..i64::from(payment.quantity))
                .map(|token_index| {
                    let id = ObjectId::new();
                    let mut document = new_token(payment, token_index, payment.date, now);
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

/// A new `issuing` record, as `IssuanceDoc::new` builds it.
fn new_record_view(payment: &Payment, mode: IssuanceMode) -> IssuanceDoc {
    IssuanceDoc {
        id: ObjectId::new(),
        provider: payment.provider.to_owned(),
        account_id: payment.account_id.to_owned(),
        payment_intent_id: payment.payment_intent_id.clone(),
        owner: payment.owner,
        token_type: payment.token_type.to_owned(),
        quantity: i64::from(payment.quantity),
        payment_date: payment.date,
        mode,
        status: IssuanceStatus::Issuing,
        created_at: DateTime::now(),
        expires_at: None,
    }
}

/// `RECORD_KEY_FIELDS` in src/store/documents.rs.
const RECORD_KEY_FIELDS: [&str; 3] = ["provider", "accountId", "paymentIntentId"];
/// `TOKEN_KEY_FIELDS` in src/store/documents.rs.
const TOKEN_KEY_FIELDS: [&str; 3] = [
    "origin.provider",
    "origin.accountId",
    "origin.paymentIntentId",
];

/// `key_filter` in src/store/documents.rs.
fn issuance_filter(payment: &Payment, names: [&str; 3]) -> Document {
    names
        .into_iter()
        .zip(key_values(payment))
        .map(|(name, value)| (name.to_owned(), Bson::String(value.to_owned())))
        .collect()
}

fn key_values(payment: &Payment) -> [&str; 3] {
    [
        payment.provider,
        payment.account_id,
        payment.payment_intent_id.as_str(),
    ]
}

/// `token_filter` in src/store/documents.rs.
fn token_filter(payment: &Payment, token_index: i64) -> RawDocumentBuf {
    let mut filter = RawDocumentBuf::new();
    for (name, value) in TOKEN_KEY_FIELDS.into_iter().zip(key_values(payment)) {
        filter.append_ref(name, value);
    }
    filter.append_ref("tokenIndex", token_index);
    filter
}

/// `new_token` in src/store/documents.rs.
fn new_token(payment: &Payment, token_index: i64, date: DateTime, now: DateTime) -> RawDocumentBuf {
    let mut origin = RawDocumentBuf::new();
    for (name, value) in RECORD_KEY_FIELDS.into_iter().zip(key_values(payment)) {
        origin.append_ref(name, value);
    }
    origin.append_ref("date", date);
    let mut token = RawDocumentBuf::new();
    token.append_ref("owner", payment.owner);
    token.append_ref("type", payment.token_type);
    token.append_ref("tokenIndex", token_index);
    token.append_ref("origin", &origin);
    token.append_ref("status", "active");
    token.append_ref("_version", 0_i32);
    token.append_ref("createdAt", now);
    token.append_ref("updatedAt", now);
    token
}

/// `bulk_command` in src/store/token_bulk.rs.
fn bulk_command(payment: &Payment, date: DateTime, now: DateTime) -> RawDocumentBuf {
    let mut updates = RawArrayBuf::new();
    for token_index in 0..i64::from(payment.quantity) {
        updates.push(rawdoc! {
            "q": token_filter(payment, token_index),
            "u": { "$setOnInsert": new_token(payment, token_index, date, now) },
            "upsert": true,
        });
    }
    rawdoc! {
        "update": TOKENS,
        "updates": updates,
        "ordered": false,
        "writeConcern": { "w": "majority" },
    }
}

/// `upserted_ids` in src/store/token_bulk.rs.
fn upserted_ids(reply: &Document) -> anyhow::Result<Vec<(i64, ObjectId)>> {
    let Ok(upserted) = reply.get_array("upserted") else {
        return Ok(Vec::new());
    };
    upserted
        .iter()
        .map(|entry| {
            let entry = entry.as_document();
            let index = entry.and_then(|e| e.get("index")).and_then(bson_integer);
            let id = entry.and_then(|e| e.get_object_id("_id").ok());
            index
                .zip(id)
                .ok_or_else(|| anyhow::anyhow!("malformed upserted entry"))
        })
        .collect()
}

fn bson_integer(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    }
}

/// `first_failure` in src/store/token_bulk.rs: `Ok(())` for a token-index race (retry),
/// `Err(message)` for anything else.
fn first_failure(reply: &Document) -> Option<Result<(), String>> {
    if let Ok(wce) = reply.get_document("writeConcernError") {
        return Some(Err(wce
            .get_str("errmsg")
            .unwrap_or("write concern error")
            .to_owned()));
    }
    let errors = reply.get_array("writeErrors").ok()?;
    let mut failure = None;
    for error in errors.iter().filter_map(Bson::as_document) {
        let code = error.get("code").and_then(bson_integer).unwrap_or_default();
        let message = error.get_str("errmsg").unwrap_or_default();
        let index = message
            .split_once("index: ")
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !(code == 11000 && index == Some(TOKENS_PAYMENT_INDEX)) {
            return Some(Err(format!("token upsert failed (code {code})")));
        }
        failure = Some(Ok(()));
    }
    failure
}

/// `fresh_tokens` in src/store/documents.rs.
fn fresh_tokens(mut inserted: Vec<(i64, ObjectId)>) -> Vec<TokenSummary> {
    inserted.sort_unstable_by_key(|(index, _)| *index);
    inserted
        .into_iter()
        .map(|(token_index, id)| TokenSummary {
            id,
            token_index,
            status: tokenmint::domain::TokenStatus::Active,
            version: 0,
        })
        .collect()
}
