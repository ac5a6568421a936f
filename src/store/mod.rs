//! The repository layer: every MongoDB call tokenmint makes lives below this module, and
//! nothing here decides a business question. It persists what `issuing` decided (the
//! upsert bulk, the transaction, the version-gated writes, the payment projection) and
//! classifies driver errors, duplicate keys by index name included.

mod atomic;
mod balances;
mod batch;
pub mod builders;
mod changes;
mod documents;
mod durability;
mod error;
mod filters;
mod idempotency;
mod indexes;
mod issuance;
mod majority;
mod payments;
mod placeholder;
mod redemptions;
pub mod retry;
mod token_bulk;
mod tokens;
mod verify;
mod webhook_events;

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::{ClientOptions, ReturnDocument, UpdateModifications};
use mongodb::{Client, Collection, Database};
use tokio::sync::OnceCell;

pub use atomic::{AtomicInsert, AtomicPlan, AtomicSet, AtomicSetsInsert};
pub use balances::BalanceRow;
pub use batch::{Marked, RecordInsert, TokenInsert, TokensAck};
pub use documents::{
    IssuanceDoc, Origin, RevokedShare, TokenDoc, TokenSummary, chrono_time, fresh_tokens,
};
pub use durability::ConnectError;
pub use error::{
    ISSUANCES_PAYMENT_INDEX, StoreError, TOKENS_PAYMENT_INDEX, duplicate_key_index,
    is_namespace_not_found, is_unavailable,
};
pub use idempotency::{
    AnswerInTransaction, Claimed, HeldRecord, IDEMPOTENCY_KEYS, IdempotencyClaim, IdempotencyDoc,
    StoredAnswer, StoredHeader,
};
pub use issuance::{LeaseAttempt, TokenHolder};
pub use payments::{PAYMENTS, PaymentDoc, ProjectionGate, TokenParamsDoc};
pub use placeholder::{Existing, PLACEHOLDER_LIFETIME};
pub use redemptions::{
    REDEMPTIONS, Redeemed, RedemptionAttempt, RedemptionDoc, Spend, SpendPlan, Spendable,
};
pub use retry::{Backoff, RetryPolicy};
pub use token_bulk::BulkResult;
pub use tokens::{GatedWrite, TokenQuery};
pub use verify::{Finding, VerifyReport};
pub use webhook_events::WEBHOOK_EVENTS;

/// Collection names.
pub const TOKENS: &str = "tokens";
pub const ISSUANCES: &str = "issuances";

/// Tunables of the store, taken from `Settings`.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Bounded retries of a token-index duplicate-key race in upsert mode.
    pub duplicate_key_retries: u32,
    /// Backoff of the `_version` gate when the client sent no `If-Match`.
    pub version_gate: RetryPolicy,
    /// Told of every command sent and answered (a span per command, when traces are
    /// exported); `None`: the driver builds no events at all.
    pub command_events: Option<EventHandler<CommandEvent>>,
}

impl Deployment {
    /// What a `hello` reply says of the deployment.
    fn from_hello(hello: &Document) -> Self {
        let replica_set = hello.get_str("setName").is_ok();
        let mongos = hello.get_str("msg").is_ok_and(|m| m == "isdbgrid");
        // One member: its only host is itself, and it lists no passive member and no
        // arbiter (hidden members are not listed, but a hidden member reads the oplog
        // like any secondary).
        let listed = |field| hello.get_array(field).map_or(0, Vec::len);
        Self {
            transactions: replica_set || mongos,
            sharded: mongos,
            single_member: replica_set
                && listed("hosts") == 1
                && listed("passives") == 0
                && listed("arbiters") == 0,
        }
    }
}

impl Store {
    /// The `_version` gate's retry policy, for the layer that retries.
    pub fn version_gate_policy(&self) -> RetryPolicy {
        self.config.version_gate
    }
}

/// A handle on tokenmint's database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    client: Client,
    db: Database,
    config: Arc<StoreConfig>,
    /// What kind of deployment this is, learnt from the first `hello`.
    deployment: Arc<OnceCell<Deployment>>,
}

/// What the first `hello` told about the deployment.
#[derive(Debug, Clone, Copy)]
struct Deployment {
    /// A replica-set member or mongos: multi-document transactions work.
    transactions: bool,
    /// A mongos in front of shards: one write's durability says nothing of another
    /// shard's, so no write may lean on a later one for its durability.
    sharded: bool,
    /// A replica set of one member, whose oplog no secondary reads.
    single_member: bool,
}

impl Store {
    /// Builds a client for `uri`, its writes pinned to majority and the journal, its reads
    /// to read concern majority on the primary (`durability`): a URI asking for less is
    /// refused. Connecting is lazy: a down database shows up as `StoreError::Unavailable`
    /// on use (after `server_selection_timeout`), not here.
    pub async fn connect(
        uri: &str,
        database: &str,
        server_selection_timeout: Duration,
        max_pool_size: u32,
        config: StoreConfig,
    ) -> Result<Self, ConnectError> {
        let mut options = ClientOptions::parse(uri).await?;
        durability::pin_durability(&mut options)?;
        // An `appName` in the URI names this instance in mongod's logs and `currentOp`
        // (and lets a test aim a failpoint at one instance); otherwise "tokenmint".
        options
            .app_name
            .get_or_insert_with(|| "tokenmint".to_owned());
        // The driver has no socket timeout: a server that stops answering (paused, network
        // partition) is noticed by the monitor's heartbeat, which then interrupts in-use
        // connections. A frequent heartbeat bounds that to about a second plus the connect
        // timeout, so requests fail fast with 503 instead of hanging.
        let heartbeat = Duration::from_millis(1000);
        refuse_overridden(&options, server_selection_timeout, max_pool_size, heartbeat)?;
        options.server_selection_timeout = Some(server_selection_timeout);
        options.connect_timeout = Some(server_selection_timeout);
        options.heartbeat_freq = Some(heartbeat);
        options.max_pool_size = Some(max_pool_size);
        options.command_event_handler = config.command_events.clone();
        let client = Client::with_options(options)?;
        let db = client.database(database);
        Ok(Self {
            client,
            db,
            config: Arc::new(config),
            deployment: Arc::new(OnceCell::new()),
        })
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    pub(crate) fn collection(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// `issuances`, typed: records are decoded straight from the reply's bytes.
    fn records(&self) -> Collection<IssuanceDoc> {
        self.db.collection(ISSUANCES)
    }

    /// One `findOneAndUpdate` upsert on `collection`, run again while it loses a
    /// first-insert race on `index`: two upserts of a key nobody has written yet may both
    /// try the insert, and the loser's duplicate key means the winner's document now
    /// exists, which the retry matches (and decides on again). Returns the document as
    /// `returned` asks.
    async fn upsert_one(
        &self,
        collection: &str,
        index: &str,
        filter: Document,
        update: impl Into<UpdateModifications>,
        returned: ReturnDocument,
    ) -> Result<Option<Document>, StoreError> {
        let collection = self.collection(collection);
        let update = update.into();
        let mut attempts = 1;
        loop {
            let result = collection
                .find_one_and_update(filter.clone(), update.clone())
                .upsert(true)
                .return_document(returned.clone())
                .await;
            match result {
                Err(err)
                    if retry::FIRST_INSERT.allows_another(attempts)
                        && duplicate_key_index(&err).as_deref() == Some(index) =>
                {
                    attempts += 1;
                    metrics::counter!(crate::telemetry::metric::DUPLICATE_KEY_RETRIES_TOTAL)
                        .increment(1);
                }
                other => return Ok(other?),
            }
        }
    }

    /// Round trip to the server; used by the `tokenmint_mongodb_up` probe.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db.run_command(doc! { "ping": 1 }).await?;
        Ok(())
    }

    /// Whether the server tokenmint's commands reach takes writes: readiness. Commands
    /// go to the primary, so a replica set without one fails to answer at all; but a
    /// member reached directly (`directConnection=true`) answers whatever it is, and a
    /// primary that stepped down still answers a `ping` while refusing every write.
    pub async fn accepts_writes(&self) -> Result<bool, StoreError> {
        let hello = self.db.run_command(doc! { "hello": 1 }).await?;
        Ok(hello.get_bool("isWritablePrimary").unwrap_or(false)
            || Deployment::from_hello(&hello).sharded)
    }

    /// Whether multi-document transactions are available: a replica-set member or mongos.
    /// A standalone server has neither `setName` nor `msg: "isdbgrid"` in its `hello`.
    pub async fn supports_transactions(&self) -> Result<bool, StoreError> {
        Ok(self.deployment().await?.transactions)
    }

    /// Whether tokenmint talks to a sharded cluster (through mongos).
    pub(crate) async fn is_sharded(&self) -> Result<bool, StoreError> {
        Ok(self.deployment().await?.sharded)
    }

    /// Whether tokenmint talks to a replica set's members directly (not a standalone, not
    /// through a mongos): every write then lands in the one primary's history.
    pub(crate) async fn is_replica_set(&self) -> Result<bool, StoreError> {
        let deployment = self.deployment().await?;
        Ok(deployment.transactions && !deployment.sharded)
    }

    /// Whether the deployment is a replica set of one member, as the first `hello` said.
    pub async fn is_single_member_set(&self) -> Result<bool, StoreError> {
        Ok(self.deployment().await?.single_member)
    }

    async fn deployment(&self) -> Result<Deployment, StoreError> {
        let deployment = self
            .deployment
            .get_or_try_init(|| async {
                let hello = self.db.run_command(doc! { "hello": 1 }).await?;
                Ok::<_, StoreError>(Deployment::from_hello(&hello))
            })
            .await?;
        Ok(*deployment)
    }

    /// Closes pooled connections; the client is unusable afterwards.
    pub async fn shutdown(self) {
        self.client.shutdown().await;
    }
}

/// Refuses a URI option that a setting, or tokenmint itself, sets to another value: the
/// URI would lose silently, and what the operator wrote and what runs would disagree (an
/// Atlas URI's `maxPoolSize=200` running with 64 connections). The same value is fine.
/// Only the option's name and value are told, never the URI.
fn refuse_overridden(
    options: &ClientOptions,
    server_selection_timeout: Duration,
    max_pool_size: u32,
    heartbeat: Duration,
) -> Result<(), ConnectError> {
    let millis = |duration: Duration| duration.as_millis().to_string();
    let governed = [
        (
            "maxPoolSize",
            options.max_pool_size.map(|size| size.to_string()),
            max_pool_size.to_string(),
            "`mongo.max_pool_size` sets it: give it there",
        ),
        (
            "serverSelectionTimeoutMS",
            options.server_selection_timeout.map(millis),
            millis(server_selection_timeout),
            "`mongo.server_selection_timeout_ms` sets it: give it there",
        ),
        (
            "connectTimeoutMS",
            options.connect_timeout.map(millis),
            millis(server_selection_timeout),
            "`mongo.server_selection_timeout_ms` sets it as well: give it there",
        ),
        (
            "heartbeatFrequencyMS",
            options.heartbeat_freq.map(millis),
            millis(heartbeat),
            "tokenmint sets it, to notice within about a second a server that stopped answering: remove the option",
        ),
    ];
    for (option, asked, runs, why) in governed {
        if let Some(asked) = asked
            && asked != runs
        {
            return Err(ConnectError::Overridden(format!(
                "sets {option}={asked}, which would run as {runs}: {why}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_set_whose_one_host_is_its_only_member_counts_as_one() {
        let one = |hello: Document| Deployment::from_hello(&hello).single_member;
        assert!(one(doc! { "setName": "rs", "hosts": ["a:27017"] }));
        assert!(!one(
            doc! { "setName": "rs", "hosts": ["a:27017", "b:27017", "c:27017"] }
        ));
        assert!(!one(
            doc! { "setName": "rs", "hosts": ["a:27017"], "passives": ["b:27017"] }
        ));
        assert!(!one(
            doc! { "setName": "rs", "hosts": ["a:27017"], "arbiters": ["c:27017"] }
        ));
        // A mongos and a standalone name no set.
        assert!(!one(doc! { "msg": "isdbgrid" }));
        assert!(!one(doc! { "isWritablePrimary": true }));
    }
}
