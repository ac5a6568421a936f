#![allow(dead_code)] // Shared by several test binaries; each uses a subset.
//! The test harness: a real mongod (single-node replica set, so transactions work), one
//! per test binary, and an app per test on port 0 with its own randomly named database,
//! dropped when the test ends (even when it panics).

use std::sync::OnceLock;
use std::time::Duration;

use mongodb::bson::{Document, doc};
use mongodb::{Client, Database};
use serde_json::Value;
use tokenmint::embedded::EmbeddedMongo;
use tokenmint::http::auth::key_hash;
use tokenmint::settings::{EmbeddedMongoSettings, Settings};
use tokenmint::startup::Application;

/// Bearer keys the test apps accept, with their scopes and accounts.
pub const ADMIN_KEY: &str = "test-admin-key";
pub const WRITER_KEY: &str = "test-writer-key";
pub const READER_KEY: &str = "test-reader-key";
pub const ACCOUNT1_KEY: &str = "test-acct1-key";
pub const REQUEST_KEY: &str = "test-request-key";

pub const OWNER: &str = "65f1a0c2b3d4e5f601234567";
pub const OTHER_OWNER: &str = "65f1a0c2b3d4e5f601234568";

/// The URI of the test mongod: `TOKENMINT_TEST_MONGO_URI` if set, else one started here.
pub fn mongo_uri() -> String {
    if let Ok(uri) = std::env::var("TOKENMINT_TEST_MONGO_URI") {
        return uri;
    }
    static URI: OnceLock<String> = OnceLock::new();
    URI.get_or_init(start_test_mongod).clone()
}

/// Starts mongod on a thread that lives as long as the test process: each test has its
/// own runtime, and mongod (which dies with the thread that started it) must outlive them.
fn start_test_mongod() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let binary_name = std::env::current_exe().unwrap();
            let stem = binary_name
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
            remove_stale_data_dirs(tmp, &stem);
            // The pid keeps concurrent runs of the same test binary apart.
            let data_dir = tmp.join(format!("mongo-{stem}-{}", std::process::id()));
            let settings = EmbeddedMongoSettings {
                binary: String::new(),
                data_dir,
            };
            match EmbeddedMongo::start(&settings).await {
                Ok(mongo) => {
                    tx.send(Ok(mongo.uri().to_owned())).unwrap();
                    // Keep `mongo` (and this thread) alive until the process exits.
                    std::future::pending::<()>().await;
                    drop(mongo);
                }
                Err(err) => tx.send(Err(err.to_string())).unwrap(),
            }
        });
    });
    rx.recv()
        .unwrap()
        .unwrap_or_else(|err| panic!("cannot start test mongod: {err}"))
}

/// Removes data directories of earlier runs whose process is gone (their mongod died
/// with them), so target/tmp does not grow run after run.
fn remove_stale_data_dirs(tmp: &std::path::Path, stem: &str) {
    let prefix = format!("mongo-{stem}-");
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Settings for a test app: port 0, the test mongod, a fresh database, the test keys, and
/// rate limits and a request timeout generous enough for the concurrency tests on a busy
/// 2-core machine (the rate-limit test sets its own limits).
pub fn test_settings(database: &str, extra: &str) -> Settings {
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
    ];
    let mut toml = format!(
        "[server]\nbind = \"127.0.0.1:0\"\nrequest_timeout_ms = 30000\n[rate_limit]\nper_key_per_second = 100000\nburst = 100000\n[mongo]\nuri = \"{}\"\ndatabase = \"{database}\"\n",
        mongo_uri()
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

/// A running app and a direct handle on its database.
pub struct TestApp {
    pub address: String,
    pub http: reqwest::Client,
    pub db: Database,
    pub db_name: String,
    /// Whether dropping this app drops its database: false for `spawn_app_on`.
    drops_db: bool,
    _shutdown: tokio::sync::oneshot::Sender<()>,
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

/// Spawns another instance on the database of an app spawned before (`db_name`), as a
/// second instance of one deployment. Dropping it leaves the database alone: the app that
/// created the database drops it.
pub async fn spawn_app_on(db_name: &str, extra: &str) -> TestApp {
    let db_name = db_name.to_owned();
    let settings = test_settings(&db_name, extra);
    let app = Application::build(&settings).await.expect("app builds");
    let address = format!("http://{}", app.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = rx.await;
    }));
    let client = Client::with_uri_str(mongo_uri()).await.unwrap();
    TestApp {
        address,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        db: client.database(&db_name),
        db_name,
        drops_db: false,
        _shutdown: tx,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if self.drops_db {
            drop_database_blocking(&self.db_name);
        }
    }
}

/// Drops database `name` from a synchronous context (a `Drop`, possibly during a panic),
/// on a runtime of its own so it works whatever runtime the test was on.
pub fn drop_database_blocking(name: &str) {
    let name = name.to_owned();
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            if let Ok(client) = Client::with_uri_str(mongo_uri()).await {
                let _ = client.database(&name).drop().await;
            }
        });
    })
    .join();
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

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
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

    pub async fn get(&self, key: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
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

    /// A store handle on this app's database, for `verify` and other checks.
    pub async fn store(&self) -> tokenmint::store::Store {
        tokenmint::store::Store::connect(
            &mongo_uri(),
            &self.db_name,
            Duration::from_secs(5),
            4,
            tokenmint::store::StoreConfig::default(),
        )
        .await
        .unwrap()
    }

    /// Every token stored for `payment`, in tokenIndex order.
    pub async fn tokens_of(&self, payment: &str) -> Vec<Document> {
        payment_tokens(&self.db, payment).await
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
}

/// Every token stored for `payment` in `db`, in tokenIndex order.
pub async fn payment_tokens(db: &Database, payment: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    db.collection::<Document>("tokens")
        .find(doc! { "origin.paymentIntentId": payment })
        .sort(doc! { "tokenIndex": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// A stored token's tokenIndex, whichever integer type holds it.
pub fn token_index(token: &Document) -> i64 {
    match token.get("tokenIndex") {
        Some(mongodb::bson::Bson::Int32(v)) => i64::from(*v),
        Some(mongodb::bson::Bson::Int64(v)) => *v,
        other => panic!("bad tokenIndex {other:?}"),
    }
}

/// Reads a JSON body, asserting the content type family.
pub async fn json(response: reqwest::Response) -> Value {
    response.json().await.expect("JSON body")
}

/// Asserts a problem+json answer with `status` and `code`; returns the body.
pub async fn assert_problem(response: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "status");
    let content_type = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status);
    body
}

/// Asserts a checkout key's 409 `idempotency_conflict`: exactly `fields` differ, each with
/// the requested value and never the recorded one. Returns the body.
pub async fn assert_hidden_conflict(response: reqwest::Response, fields: &[&str]) -> Value {
    let problem = assert_problem(response, 409, "idempotency_conflict").await;
    let mismatches = problem["mismatches"].as_array().unwrap();
    let named: Vec<&str> = mismatches
        .iter()
        .map(|m| m["field"].as_str().unwrap())
        .collect();
    assert_eq!(named, fields, "{problem}");
    assert!(
        mismatches
            .iter()
            .all(|m| m.get("existing").is_none() && m.get("requested").is_some()),
        "a checkout key is told what differs, never the recorded value: {problem}"
    );
    problem
}

/// The ids of an issuance answer's tokens, in order.
pub fn token_ids(body: &Value) -> Vec<String> {
    body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}
