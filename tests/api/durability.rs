//! Durability does not rest on what `mongo.uri` or the server default says: a URI asking
//! for less than majority writes, majority reads or the primary is refused at startup,
//! naming the option, and the commands the service sends carry `w: "majority"` (journaled)
//! and read concern `majority` whatever the URI says — as mongod's profiler records them.

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use tokenmint::startup::Application;

use crate::helpers::*;

/// `mongo_uri()` with `option` appended.
fn uri_with(option: &str) -> String {
    let uri = mongo_uri();
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}{option}")
}

/// The error `Application::build` answers for a URI with `option`.
async fn refusal(uri: &str) -> String {
    let db = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    match Application::build(&test_settings_at(uri, &db, "")).await {
        Ok(_) => panic!("a URI with less durability started: {uri}"),
        Err(err) => format!("{err:#}"),
    }
}

#[tokio::test]
async fn a_uri_asking_for_less_is_refused_naming_the_option() {
    for (option, named, needed) in [
        ("w=1", "w=1", "w=majority"),
        ("w=0", "w=0", "w=majority"),
        ("w=2", "w=2", "w=majority"),
        ("w=dataCenters", "w=dataCenters", "w=majority"),
        ("journal=false", "journal=false", "journal"),
        ("w=majority&journal=false", "journal=false", "journal"),
        (
            "readPreference=primaryPreferred",
            "readPreference=primaryPreferred",
            "readPreference=primary",
        ),
        (
            "readPreference=secondary",
            "readPreference=secondary",
            "readPreference=primary",
        ),
        (
            "readPreference=nearest",
            "readPreference=nearest",
            "readPreference=primary",
        ),
        (
            "readConcernLevel=local",
            "readConcernLevel=local",
            "readConcernLevel=majority",
        ),
        (
            "readConcernLevel=available",
            "readConcernLevel=available",
            "readConcernLevel=majority",
        ),
    ] {
        let err = refusal(&uri_with(option)).await;
        assert!(err.contains("`mongo.uri`"), "{option}: {err}");
        assert!(err.contains(named), "{option} not named: {err}");
        assert!(
            err.contains(needed),
            "{option}: what is needed not said: {err}"
        );
        assert!(
            !err.contains("127.0.0.1"),
            "{option}: the URI echoed: {err}"
        );
    }
    // The credentials of a URI are never printed (the host is never reached).
    let err = refusal("mongodb://tokenmint:S3cretPassw0rd@127.0.0.1:1/?w=1").await;
    assert!(err.contains("w=1"), "{err}");
    assert!(!err.contains("S3cret"), "{err}");
}

#[tokio::test]
async fn a_uri_asking_for_what_tokenmint_does_anyway_is_accepted() {
    let uri = uri_with(
        "w=majority&journal=true&wtimeoutMS=10000&readConcernLevel=majority&readPreference=primary",
    );
    let db_name = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
    let app = spawn_app_from(&test_settings_at(&uri, &db_name, "")).await;
    let ids = app.issue_tokens("pi_durable_uri", 1).await;
    assert_eq!(ids.len(), 1);
    app.db.drop().await.unwrap();
}

/// A profiled write's applied concern is majority, journaled, and the client's own (not
/// mongod's implicit default, which a replica set may set to `w: 1`).
fn assert_majority_journaled(write: &Document) {
    let concern = write.get_document("writeConcern").expect("a write concern");
    assert_eq!(concern.get_str("w"), Ok("majority"), "{write}");
    assert_eq!(concern.get_bool("j"), Ok(true), "{write}");
    assert_eq!(
        concern.get_str("provenance"),
        Ok("clientSupplied"),
        "{write}"
    );
}

/// The profiler's entries of `command` (its name, e.g. `findAndModify`) on `collection`
/// that the service sent (its client is named `tokenmint`; the test's own is not).
async fn profiled(app: &TestApp, command: &str, collection: &str) -> Vec<Document> {
    app.db
        .collection::<Document>("system.profile")
        .find(doc! { format!("command.{command}"): collection, "appName": "tokenmint" })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn commands_carry_majority_whatever_the_uri_says() {
    // The test URI says nothing of write concern, read concern or read preference.
    let app = spawn_app().await;
    app.db.run_command(doc! { "profile": 2 }).await.unwrap();
    let ids = app.issue_tokens("pi_durable_commands", 2).await;
    let redeem = app.redeem_token(ADMIN_KEY, &ids[0]).await;
    assert_eq!(redeem.status(), 200);
    let read = app.get(ADMIN_KEY, &format!("/v1/tokens/{}", ids[1])).await;
    assert_eq!(read.status(), 200);
    app.db.run_command(doc! { "profile": 0 }).await.unwrap();
    assert_eq!(
        app.stored_token(&ids[0]).await.get_str("status"),
        Ok("redeemed")
    );

    // mongod records the concern it applied and where it came from: the client must have
    // supplied it (not mongod's implicit default, which a replica set may set to `w: 1`).
    // The redeem's version-gated write: majority, journaled.
    let writes = profiled(&app, "findAndModify", "tokens").await;
    assert!(!writes.is_empty(), "no findAndModify profiled");
    writes.iter().for_each(assert_majority_journaled);
    // Every read of tokens (the redeem's read, GET /v1/tokens/{id}): read concern majority.
    let reads = profiled(&app, "find", "tokens").await;
    assert!(reads.len() >= 2, "{reads:?}");
    for read in &reads {
        let concern = read.get_document("readConcern").expect("a read concern");
        assert_eq!(concern.get_str("level"), Ok("majority"), "{read}");
        assert_eq!(
            concern.get_str("provenance"),
            Ok("clientSupplied"),
            "{read}"
        );
    }
}

#[tokio::test]
async fn a_batch_has_the_primary_alone_acknowledge_its_records_and_tokens_then_marks_them() {
    let app = spawn_app().await;
    app.db.run_command(doc! { "profile": 2 }).await.unwrap();
    let ids = app.issue_tokens("pi_durable_batch", 3).await;
    app.db.run_command(doc! { "profile": 0 }).await.unwrap();
    assert_eq!(ids.len(), 3);
    let record = app
        .find_stored("issuances", doc! { "paymentIntentId": "pi_durable_batch" })
        .await;
    assert_eq!(record.get_str("status"), Ok("issued"), "{record}");

    // The record and the tokens: the primary's acknowledgement alone, unjournaled, the
    // exceptions; then the mark, whose majority covers both (its write concern is the
    // client's pinned one, `durability`'s unit tests; the term check, the failover suite).
    let records = profiled(&app, "insert", "issuances").await;
    let tokens = profiled(&app, "insert", "tokens").await;
    assert_eq!(
        (records.len(), tokens.len()),
        (1, 1),
        "{records:?} {tokens:?}"
    );
    let (record_insert, token_insert) = (&records[0], &tokens[0]);
    for insert in [record_insert, token_insert] {
        let concern = insert
            .get_document("writeConcern")
            .expect("a write concern");
        assert_eq!(concern.get_i32("w"), Ok(1), "{insert}");
        assert_eq!(concern.get_bool("j"), Ok(false), "{insert}");
    }
    // The profiler does not record an update's write concern: only that the mark came last.
    let marks: Vec<Document> = app
        .db
        .collection::<Document>("system.profile")
        .find(doc! {
            "op": "update",
            "ns": format!("{}.issuances", app.db_name),
            "appName": "tokenmint",
        })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(marks.len(), 1, "{marks:?}");
    let at = |entry: &Document| *entry.get_datetime("ts").expect("a ts");
    assert!(
        at(token_insert) >= at(record_insert),
        "{tokens:?} before {records:?}"
    );
    assert!(
        at(&marks[0]) >= at(token_insert),
        "{marks:?} before {tokens:?}"
    );
}

/// A standalone mongod on a port of its own, killed with the test.
struct Standalone {
    child: std::process::Child,
    uri: String,
    data_dir: std::path::PathBuf,
}

impl Standalone {
    async fn start(app_name: &str) -> Standalone {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data_dir = target_dir().join("tmp").join(format!("standalone-{port}"));
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir).unwrap();
        let mut command = std::process::Command::new(mongod_binary());
        command
            .args(["--port", &port.to_string(), "--bind_ip", "127.0.0.1"])
            .arg("--dbpath")
            .arg(&data_dir)
            .args(["--setParameter", "enableTestCommands=1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        tokenmint::embedded::die_with_parent(&mut command, libc::SIGKILL);
        let standalone = Standalone {
            child: command.spawn().expect("mongod starts"),
            uri: format!("mongodb://127.0.0.1:{port}/?appName={app_name}"),
            data_dir,
        };
        let client = mongodb::Client::with_uri_str(&standalone.uri)
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the standalone answers"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        standalone
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// An app on a standalone of its own, and one token it issued.
struct OnStandalone {
    // Dropped before the server it drops its database on.
    app: TestApp,
    standalone: Standalone,
    app_name: String,
    db: String,
    id: String,
}

impl OnStandalone {
    async fn with_token(payment: &str) -> OnStandalone {
        let app_name = unique_app_name();
        let standalone = Standalone::start(&app_name).await;
        let db = format!("tokenmint_test_{}", uuid::Uuid::new_v4().simple());
        let app = spawn_app_from(&test_settings_at(&standalone.uri, &db, "")).await;
        let id = app.issue_tokens(payment, 1).await.remove(0);
        OnStandalone {
            app,
            standalone,
            app_name,
            db,
            id,
        }
    }

    /// Makes the next of the app's commands that `fault` names fail as it says, once
    /// (`failCommand`; `fault` without `appName`, which this adds).
    async fn fail_once(&self, mut fault: Document) {
        fault.insert("appName", &self.app_name);
        mongodb::Client::with_uri_str(&self.standalone.uri)
            .await
            .unwrap()
            .database("admin")
            .run_command(doc! {
                "configureFailPoint": "failCommand",
                "mode": { "times": 1 },
                "data": fault,
            })
            .await
            .unwrap();
    }

    /// Redeems the token, with `idempotency_key` when given.
    async fn redeem(&self, idempotency_key: Option<&str>) -> reqwest::Response {
        let mut request = self
            .app
            .http
            .post(format!("{}/v1/tokens/{}/redeem", self.app.address, self.id))
            .bearer_auth(ADMIN_KEY);
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.unwrap()
    }

    async fn token_status(&self) -> String {
        let token = self.app.stored_token(&self.id).await;
        token.get_str("status").unwrap().to_owned()
    }
}

/// On a standalone, a redeem whose time limit (1 s, for a token another writer holds)
/// ran out while it waited for the journal applied in memory: a read shows it before the
/// journal has it, so nothing but that wait could have said it is durable. 503, as before
/// (on a replica set the wait goes on until the majority shows the write).
#[tokio::test]
async fn on_a_standalone_a_write_out_of_time_waiting_for_its_journal_is_unavailable() {
    let on = OnStandalone::with_token("pi_standalone_journal").await;
    on.fail_once(doc! {
        "failCommands": ["findAndModify"],
        "writeConcernError": { "code": 50, "errmsg": "failpoint: journal wait ran out" },
    })
    .await;
    assert_problem(on.redeem(None).await, 503, "database_unavailable").await;
    assert_eq!(
        on.token_status().await,
        "redeemed",
        "the write applied in memory"
    );
}

/// On a standalone the answer to a keyed action is kept after its write (there is no
/// transaction to commit them together): when keeping it fails, the action has written
/// all the same, so its answer is given, not replaced by the database's error (which
/// on a replica set replaces an answer that wrote nothing).
#[tokio::test]
async fn on_a_standalone_a_keyed_redeem_whose_answer_could_not_be_kept_is_still_answered() {
    let on = OnStandalone::with_token("pi_standalone_keyed").await;
    on.fail_once(doc! {
        "failCommands": ["update"],
        "namespace": format!("{}.idempotency_keys", on.db),
        "errorCode": 91,
    })
    .await;
    assert_eq!(on.redeem(Some("k-standalone")).await.status(), 200);
    assert_eq!(on.token_status().await, "redeemed");
    let record = on
        .app
        .find_stored("idempotency_keys", doc! { "key": "k-standalone" })
        .await;
    assert!(
        !record.contains_key("answer"),
        "the keeping failed: {record}"
    );
}
