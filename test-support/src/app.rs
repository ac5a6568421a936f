//! The service in-process: an app per test on port 0 with its own randomly named
//! database, dropped when the test ends (even when it panics), and the bearer keys it
//! accepts.

use std::time::Duration;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Client, Database};
use serde_json::Value;
use tokenmint::http::auth::key_hash;
use tokenmint::settings::Settings;
use tokenmint::startup::Application;
use tokio::task::JoinHandle;

use crate::answers::{json, payment_tokens, token_ids, token_index};
use crate::failpoint::mongo_uri_named;
use crate::mongod::{connect_store, drop_database_blocking, mongo_uri};
use crate::shard_keys::ShardKeyCheck;

/// Bearer keys the test apps accept, with their scopes and accounts.
pub const ADMIN_KEY: &str = "test-admin-key";
pub const WRITER_KEY: &str = "test-writer-key";
pub const READER_KEY: &str = "test-reader-key";
pub const ACCOUNT1_KEY: &str = "test-acct1-key";
pub const REQUEST_KEY: &str = "test-request-key";
/// May redeem tokens and nothing else (a ticket gate): not even read them.
pub const REDEEMER_KEY: &str = "test-redeemer-key";

pub const OWNER: &str = "65f1a0c2b3d4e5f601234567";
pub const OTHER_OWNER: &str = "65f1a0c2b3d4e5f601234568";

/// Settings for a test app on the test mongod: see [`test_settings_at`].
pub fn test_settings(database: &str, extra: &str) -> Settings {
    test_settings_at(&mongo_uri(), database, extra)
}

/// Settings for a test app: port 0, the deployment at `uri`, `database`, the test keys,
/// and rate limits and a request timeout generous enough for the concurrency tests on a
/// busy 2-core machine (the rate-limit test sets its own limits); `extra` TOML last.
pub fn test_settings_at(uri: &str, database: &str, extra: &str) -> Settings {
    let keys = [
        ("admin", ADMIN_KEY, "[\"admin\"]", None),
        ("writer", WRITER_KEY, "[\"issuances:write\"]", None),
        ("reader", READER_KEY, "[\"read\"]", None),
        (
            "acct1",
            ACCOUNT1_KEY,
            "[\"issuances:write\", \"read\", \"tokens:redeem\", \"tokens:revoke\", \"tokens:transfer\"]",
            Some("[\"acct_1\"]"),
        ),
        ("checkout", REQUEST_KEY, "[\"issuances:request\"]", None),
        ("redeemer", REDEEMER_KEY, "[\"tokens:redeem\"]", None),
    ];
    let mut toml = format!(
        "[server]\nbind = \"127.0.0.1:0\"\nrequest_timeout_ms = 30000\n[rate_limit]\nper_key_per_second = 100000\nburst = 100000\nper_address_per_second = 100000\nper_address_burst = 100000\n[mongo]\nuri = \"{uri}\"\ndatabase = \"{database}\"\n",
    );
    for (id, key, scopes, accounts) in keys {
        toml.push_str(&format!(
            "[[auth.keys]]\nid = \"{id}\"\nsha256 = \"{}\"\nscopes = {scopes}\n",
            key_hash(key)
        ));
        if let Some(accounts) = accounts {
            toml.push_str(&format!("accounts = {accounts}\n"));
        }
    }
    Settings::with_overrides(&[&toml, extra]).expect("test settings")
}

/// How long the tests' HTTP clients keep an idle connection: well below the server's
/// idle bound (`server.header_read_timeout_ms`, 10 s by default). A client that keeps
/// one longer can pick it from its pool at the moment the server closes it, and that
/// request dies on the wire (reset, or the answer cut off): the keep-alive race every
/// client of a server with an idle timeout must avoid this way.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// An HTTP client builder for talking to the service under test: idle connections are
/// dropped after [`CLIENT_IDLE_TIMEOUT`].
pub fn http_client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(CLIENT_IDLE_TIMEOUT)
}

/// A running app and a direct handle on its database.
pub struct TestApp {
    pub address: String,
    pub http: reqwest::Client,
    pub db: Database,
    pub db_name: String,
    /// Whether dropping this app drops its database: false for `spawn_app_on`.
    drops_db: bool,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    /// Every write the app sent that a sharded cluster would refuse: the test fails on
    /// any when the app is dropped.
    shard_keys: ShardKeyCheck,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with("").await
}

/// Spawns an app with `extra` TOML appended to the test settings.
pub async fn spawn_app_with(extra: &str) -> TestApp {
    let db_name = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    let mut app = spawn_app_on(&db_name, extra).await;
    app.drops_db = true;
    app
}

/// Spawns an app whose MongoDB client is named `app_name` (see [`crate::failpoint`]):
/// failpoints aimed at that name fail its commands only. The test's own handle on the
/// database (`db`) is not named so, and reads the truth whatever fails.
pub async fn spawn_app_named(app_name: &str, extra: &str) -> TestApp {
    let db_name = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    spawn_instance_named(app_name, &db_name, extra, true).await
}

/// Another instance on `db_name` (an app spawned before), its client named `app_name`.
pub async fn spawn_app_on_named(app_name: &str, db_name: &str, extra: &str) -> TestApp {
    spawn_instance_named(app_name, db_name, extra, false).await
}

async fn spawn_instance_named(
    app_name: &str,
    db_name: &str,
    extra: &str,
    drops_db: bool,
) -> TestApp {
    let settings = test_settings_at(&mongo_uri_named(app_name), db_name, extra);
    let mut app = spawn_app_from(&settings).await;
    let client = Client::with_uri_str(mongo_uri()).await.unwrap();
    app.db = client.database(db_name);
    app.drops_db = drops_db;
    app
}

/// Spawns another instance on the database of an app spawned before (`db_name`), as a
/// second instance of one deployment. Dropping it leaves the database alone: the app that
/// created the database drops it.
pub async fn spawn_app_on(db_name: &str, extra: &str) -> TestApp {
    spawn_app_from(&test_settings(db_name, extra)).await
}

/// Spawns an app from `settings` as they are (another deployment than the test mongod,
/// say). Dropping it leaves the database alone.
pub async fn spawn_app_from(settings: &Settings) -> TestApp {
    let shard_keys = ShardKeyCheck::default();
    let app = Application::build_observed(settings, Some(shard_keys.observer()))
        .await
        .expect("app builds");
    let address = format!("http://{}", app.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let _ = app
            .run_until_stopped(async move {
                let _ = rx.await;
            })
            .await;
    });
    let client = Client::with_uri_str(
        settings
            .mongo
            .configured_uri()
            .expect("a test app names its mongod"),
    )
    .await
    .unwrap();
    let db_name = settings.mongo.database.clone();
    TestApp {
        address,
        http: http_client_builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        db: client.database(&db_name),
        db_name,
        drops_db: false,
        shutdown: Some(tx),
        server: Some(server),
        shard_keys,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if self.drops_db {
            drop_database_blocking(&self.db_name);
        }
        let refused = self.shard_keys.refused();
        // Not while the test is failing already: a panic in a panic aborts the binary.
        if !refused.is_empty() && !std::thread::panicking() {
            panic!(
                "writes a sharded cluster would refuse (docs/scaling.md):\n{}",
                refused.join("\n")
            );
        }
    }
}

/// A valid issuance body for `payment`, to be tweaked per test.
pub fn issuance_body(payment: &str, quantity: i64) -> Value {
    serde_json::json!({
        "provider": "stripe",
        "accountId": "acct_1",
        "paymentIntentId": payment,
        "owner": OWNER,
        "tokenType": "standard",
        "quantity": quantity,
    })
}

/// The issuance of [`issuance_body`] as the HTTP layer parses it, in atomic mode: for
/// tests that call the store directly.
pub fn atomic_issuance(payment: &str, quantity: i64) -> tokenmint::domain::NewIssuance {
    use tokenmint::domain::*;
    NewIssuance {
        key: PaymentKey {
            provider: Provider::parse("stripe").unwrap(),
            account_id: AccountId::parse("acct_1").unwrap(),
            payment_intent_id: PaymentIntentId::parse(payment).unwrap(),
        },
        params: IssuanceParams {
            owner: Owner::from_object_id(ObjectId::parse_str(OWNER).unwrap()),
            token_type: TokenType::parse("standard").unwrap(),
            quantity: Quantity::from_i64(quantity, 1000).unwrap(),
        },
        payment_date: chrono::Utc::now(),
        mode: IssuanceMode::Atomic,
        requested_by: Actor::api_key("test"),
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// Shuts the app down gracefully and waits until it has stopped serving (dropping
    /// it only asks it to stop).
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    /// Stores `payment` (provider, account, payment id) as the webhook projection records
    /// it after one event of `event_type` that left it `status`, at `at`: for tests that
    /// need a payment's state without delivering its events.
    pub async fn store_payment(
        &self,
        (provider, account, payment): (&str, &str, &str),
        status: &str,
        event_type: &str,
        at: DateTime,
    ) {
        self.db
            .collection::<Document>("payments")
            .insert_one(doc! {
                "provider": provider,
                "accountId": account,
                "paymentIntentId": payment,
                "status": status,
                "version": 1_i64,
                "lastEventId": format!("evt_{provider}_{account}_{payment}"),
                "lastEventType": event_type,
                "createdAt": at,
                "updatedAt": at,
            })
            .await
            .expect("payment stored");
    }

    /// POST /v1/issuances as `key`.
    pub async fn issue(&self, key: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/issuances"))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// POST /v1/issuances as the writer key with a raw `body` of `content_type`, for
    /// bodies a JSON value cannot express (malformed, another type, oversized).
    pub async fn issue_raw(
        &self,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.http
            .post(self.url("/v1/issuances"))
            .bearer_auth(WRITER_KEY)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request sent")
    }

    /// POST /v1/tokens/{id}/redeem as `key`, without a body: one token redeemed by its id,
    /// for tests that need a token spent before what they check.
    pub async fn redeem_token(&self, key: &str, id: &str) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/v1/tokens/{id}/redeem")))
            .bearer_auth(key)
            .send()
            .await
            .expect("request sent")
    }

    /// Transfers token `id`, at `version` (its `If-Match`), to `new_owner` as `key`.
    pub async fn transfer_token(
        &self,
        key: &str,
        id: &str,
        version: i64,
        new_owner: &str,
    ) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/v1/tokens/{id}/transfer")))
            .bearer_auth(key)
            .header("if-match", format!("\"{version}\""))
            .json(&serde_json::json!({ "newOwner": new_owner }))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn count(&self, collection: &str, filter: Document) -> u64 {
        self.db
            .collection::<Document>(collection)
            .count_documents(filter)
            .await
            .unwrap()
    }

    /// How many issuance records match `filter`: a refund's placeholder, which holds a
    /// payment's place in `issuances` but is no record, is not counted.
    pub async fn count_records(&self, mut filter: Document) -> u64 {
        filter.insert("status", mongodb::bson::doc! { "$ne": "placeholder" });
        self.count("issuances", filter).await
    }

    /// The `/metrics` text. The recorder is process-wide: it counts for every app of the
    /// test binary, so a test compares values before and after, never absolute ones.
    pub async fn metrics(&self) -> String {
        let response = self.get(READER_KEY, "/metrics").await;
        assert_eq!(response.status(), 200, "GET /metrics");
        response.text().await.expect("the /metrics text")
    }

    /// The one document of `collection` matching `filter`, which must exist.
    pub async fn find_stored(&self, collection: &str, filter: Document) -> Document {
        self.db
            .collection::<Document>(collection)
            .find_one(filter.clone())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("nothing in {collection} matches {filter}"))
    }

    /// A store handle on this app's database, for `verify` and other checks.
    pub async fn store(&self) -> tokenmint::store::Store {
        connect_store(&mongo_uri(), &self.db_name).await
    }

    /// Issues `quantity` tokens for `payment` with the admin key (an [`issuance_body`]),
    /// asserting the 201, and returns their ids in tokenIndex order.
    pub async fn issue_tokens(&self, payment: &str, quantity: i64) -> Vec<String> {
        let response = self
            .issue(ADMIN_KEY, &issuance_body(payment, quantity))
            .await;
        assert_eq!(response.status(), 201);
        token_ids(&json(response).await)
    }

    /// The token ids of the issuance of stripe/acct_1 `payment` (the provider and account
    /// of an [`issuance_body`]) as `GET /v1/issuances/…` answers them, in tokenIndex order.
    pub async fn issued_token_ids(&self, payment: &str) -> Vec<String> {
        let path = format!("/v1/issuances/stripe/acct_1/{payment}");
        let response = self.get(ADMIN_KEY, &path).await;
        assert_eq!(response.status(), 200, "{path}");
        token_ids(&json(response).await)
    }

    /// The token stored under `id`, which must exist.
    pub async fn stored_token(&self, id: &str) -> Document {
        let id = ObjectId::parse_str(id).expect("a token id");
        self.find_stored("tokens", doc! { "_id": id }).await
    }

    /// Every token stored for `payment`, in tokenIndex order.
    pub async fn tokens_of(&self, payment: &str) -> Vec<Document> {
        payment_tokens(&self.db, payment).await
    }

    /// The ids of the tokens stored for `payment`, in tokenIndex order.
    pub async fn stored_token_ids(&self, payment: &str) -> Vec<String> {
        self.tokens_of(payment)
            .await
            .iter()
            .map(|t| t.get_object_id("_id").unwrap().to_hex())
            .collect()
    }

    /// The tokenIndexes stored for `payment`, sorted.
    pub async fn token_indexes(&self, payment: &str) -> Vec<i64> {
        self.tokens_of(payment)
            .await
            .iter()
            .map(token_index)
            .collect()
    }

    /// (tokenIndex, status) of every token of `payment`, in tokenIndex order.
    pub async fn token_states(&self, payment: &str) -> Vec<(i64, String)> {
        self.tokens_of(payment)
            .await
            .iter()
            .map(|t| (token_index(t), t.get_str("status").unwrap().to_owned()))
            .collect()
    }

    /// The tokenIndex of each of `payment`'s active tokens, in order.
    pub async fn active_indexes(&self, payment: &str) -> Vec<i64> {
        self.token_states(payment)
            .await
            .into_iter()
            .filter(|(_, status)| status == "active")
            .map(|(index, _)| index)
            .collect()
    }
}
