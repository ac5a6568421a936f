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
//!
//! This file holds what both designs share (connecting, dispatch, the replay, the token
//! bulk and the token read); `upsert` holds where the designs differ, `atomic` the
//! transaction both run in atomic mode.

mod atomic;
mod upsert;

use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{DateTime, doc, oid::ObjectId};
use mongodb::options::{Acknowledgment, ClientOptions, WriteConcern};
use mongodb::{Client, Collection, Database};
use tokenmint::domain::{IssuanceMode, NewIssuance};
use tokenmint::store::builders::{
    BulkFailure, bulk_command, first_failure, payment_tokens_filter, upserted_ids,
};
use tokenmint::store::{ISSUANCES, IssuanceDoc, TOKENS, TokenSummary, chrono_time};

use crate::op_times::{Op, OpTimes};
use crate::service::{migrated_store, service_settings};
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
        migrated_store(&settings).await?.shutdown().await;

        let timeout = settings.server_selection_timeout();
        let mut options = ClientOptions::parse(uri).await?;
        let app_name = match design {
            Design::PerRequest => "tokenmint-bench-floor",
            Design::Reference => "tokenmint-bench-reference-floor",
        };
        options.app_name = Some(app_name.to_owned());
        // The service's durability whatever the URI says: its hand-written commands carry
        // the client's write concern.
        options.write_concern = Some(
            WriteConcern::builder()
                .w(Acknowledgment::Majority)
                .journal(true)
                .build(),
        );
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
        let command = bulk_command(request, None, DateTime::now(), &self.db);
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
}
