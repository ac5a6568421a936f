//! MongoDB's own faults, at the exact step a test wants: `configureFailPoint failCommand`
//! on the test mongod (started with `enableTestCommands=1`).
//!
//! A failpoint is server-wide, and the tests of one binary share one mongod, so every
//! failpoint here is aimed at one client by its `appName`: a test gives its app a URI
//! with its own name ([`FaultyApp`]), and commands of every other test pass untouched.

use std::sync::{Arc, LazyLock};

use mongodb::Client;
use mongodb::bson::{Bson, Document, doc};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::mongod::mongo_uri;

/// An application name no other test uses, for a URI and the failpoints aimed at it.
pub fn unique_app_name() -> String {
    format!("tm-fault-{}", uuid::Uuid::new_v4().simple())
}

/// The test mongod's URI with `appName` set: clients built from it carry that name.
pub fn mongo_uri_named(app_name: &str) -> String {
    let uri = mongo_uri();
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}appName={app_name}")
}

/// How a failed command fails.
#[derive(Debug, Clone)]
pub enum Fault {
    /// The command answers this error code (e.g. 91 ShutdownInProgress, 11600
    /// InterruptedAtShutdown, 112 WriteConflict), with these error labels.
    Error { code: i32, labels: Vec<String> },
    /// The server closes the connection instead of answering.
    CloseConnection,
    /// The command runs (and, for a commit, commits), then answers this write concern
    /// error (e.g. 64 WriteConcernFailed): the client is told it failed although it
    /// applied.
    WriteConcernError { code: i32 },
    /// The command waits this many milliseconds, then runs normally.
    Block { millis: i64 },
}

impl Fault {
    /// An error code without labels.
    pub fn error(code: i32) -> Self {
        Self::Error {
            code,
            labels: Vec::new(),
        }
    }
}

/// One `failCommand` failpoint, aimed at the clients named `app_name`. Turned off by
/// [`FailPoint::off`], or when dropped.
pub struct FailPoint {
    client: Client,
    /// The server's count of failpoint entries when this one was set: it counts since
    /// mongod started, for every failpoint set before, so this one's own are the rest.
    entered_before: i64,
    turned_off: bool,
    /// The server has one `failCommand` failpoint: a second test setting it would replace
    /// this one's. Tests that use failpoints take turns (other tests run on).
    turn: Option<OwnedMutexGuard<()>>,
}

/// Whose turn it is to use the server's one `failCommand` failpoint.
static TURN: LazyLock<Arc<Mutex<()>>> = LazyLock::new(|| Arc::new(Mutex::new(())));

/// The turn to use the server's one `failCommand` failpoint, taken ahead of setting it:
/// a test that sets its failpoint at a chosen moment of a flow takes its turn before the
/// flow starts, so that waiting for another test's failpoint cannot move that moment.
pub struct FailPointTurn(OwnedMutexGuard<()>);

impl FailPointTurn {
    /// Waits until no other test's failpoint is set, and keeps others from setting one.
    pub async fn take() -> Self {
        Self(TURN.clone().lock_owned().await)
    }

    /// [`FailPoint::set`] in this turn.
    pub async fn set(
        self,
        app_name: &str,
        commands: &[&str],
        fault: Fault,
        times: i64,
    ) -> FailPoint {
        let mode = doc! { "times": times }.into();
        FailPoint::configure(self, app_name, commands, None, fault, mode).await
    }

    /// [`FailPoint::set_on`] in this turn.
    pub async fn set_on(
        self,
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        fault: Fault,
        times: i64,
    ) -> FailPoint {
        let mode = doc! { "times": times }.into();
        FailPoint::configure(self, app_name, commands, Some(namespace), fault, mode).await
    }

    /// [`FailPoint::always`] in this turn.
    pub async fn always(self, app_name: &str, commands: &[&str], fault: Fault) -> FailPoint {
        FailPoint::configure(self, app_name, commands, None, fault, "alwaysOn".into()).await
    }
}

impl FailPoint {
    /// Makes the next `times` of `commands` (e.g. `["update"]`, `["find", "insert"]`)
    /// sent by clients named `app_name` fail as `fault` says.
    pub async fn set(app_name: &str, commands: &[&str], fault: Fault, times: i64) -> Self {
        FailPointTurn::take()
            .await
            .set(app_name, commands, fault, times)
            .await
    }

    /// As [`FailPoint::set`], for every such command but the first, until turned off.
    pub async fn after_first(app_name: &str, commands: &[&str], fault: Fault) -> Self {
        let turn = FailPointTurn::take().await;
        let mode = doc! { "skip": 1 }.into();
        Self::configure(turn, app_name, commands, None, fault, mode).await
    }

    /// As [`FailPoint::set`], for those of `commands` on the collection `namespace`
    /// (`database.collection`) alone: aims at one step of a flow whose other steps send
    /// the same command to other collections.
    pub async fn set_on(
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        fault: Fault,
        times: i64,
    ) -> Self {
        FailPointTurn::take()
            .await
            .set_on(app_name, commands, namespace, fault, times)
            .await
    }

    /// As [`FailPoint::after_first`], for those of `commands` on the collection
    /// `namespace` alone (as [`FailPoint::set_on`]): aims at the second of two steps
    /// that send the same command to the same collection.
    pub async fn after_first_on(
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        fault: Fault,
    ) -> Self {
        Self::after_on(app_name, commands, namespace, 1, fault).await
    }

    /// As [`FailPoint::after_first_on`], past the first `skip` such commands: aims at a
    /// later one of several steps that send the same command to the same collection.
    pub async fn after_on(
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        skip: i64,
        fault: Fault,
    ) -> Self {
        let mode = doc! { "skip": skip }.into();
        Self::on(app_name, commands, namespace, fault, mode).await
    }

    /// As [`FailPoint::always`], for those of `commands` on the collection `namespace`
    /// alone (as [`FailPoint::set_on`]).
    pub async fn always_on(
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        fault: Fault,
    ) -> Self {
        Self::on(app_name, commands, namespace, fault, "alwaysOn".into()).await
    }

    async fn on(
        app_name: &str,
        commands: &[&str],
        namespace: &str,
        fault: Fault,
        mode: Bson,
    ) -> Self {
        let turn = FailPointTurn::take().await;
        Self::configure(turn, app_name, commands, Some(namespace), fault, mode).await
    }

    /// As [`FailPoint::set`], for every such command until turned off.
    pub async fn always(app_name: &str, commands: &[&str], fault: Fault) -> Self {
        FailPointTurn::take()
            .await
            .always(app_name, commands, fault)
            .await
    }

    async fn configure(
        FailPointTurn(turn): FailPointTurn,
        app_name: &str,
        commands: &[&str],
        namespace: Option<&str>,
        fault: Fault,
        mode: Bson,
    ) -> Self {
        let client = Client::with_uri_str(mongo_uri())
            .await
            .expect("admin client");
        let mut data = doc! { "failCommands": commands, "appName": app_name };
        if let Some(namespace) = namespace {
            data.insert("namespace", namespace);
        }
        match fault {
            Fault::Error { code, labels } => {
                data.insert("errorCode", code);
                if !labels.is_empty() {
                    data.insert("errorLabels", labels);
                }
            }
            Fault::CloseConnection => {
                data.insert("closeConnection", true);
            }
            Fault::WriteConcernError { code } => {
                data.insert(
                    "writeConcernError",
                    doc! { "code": code, "errmsg": "failpoint: write concern not satisfied" },
                );
            }
            Fault::Block { millis } => {
                data.insert("blockConnection", true);
                data.insert("blockTimeMS", millis);
            }
        }
        let answer = client
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
            .await
            .expect("configureFailPoint (the test mongod runs with enableTestCommands=1)");
        Self {
            client,
            entered_before: entry_count(&answer),
            turned_off: false,
            turn: Some(turn),
        }
    }

    /// Sets the failpoint anew in this test's turn: from now on the next `times` of
    /// `commands` fail as `fault` says (a command the old setting holds up stays held up).
    pub async fn replace(
        mut self,
        app_name: &str,
        commands: &[&str],
        fault: Fault,
        times: i64,
    ) -> Self {
        let turn = FailPointTurn(self.turn.take().expect("a failpoint holds its turn"));
        // Not turned off in between: the new setting replaces the old one.
        self.turned_off = true;
        drop(self);
        turn.set(app_name, commands, fault, times).await
    }

    /// Whether the failpoint has failed (or held up) `times` commands since it was set,
    /// waiting up to `within` for it.
    pub async fn fired_within(&self, times: i64, within: std::time::Duration) -> bool {
        self.client
            .database("admin")
            .run_command(doc! {
                "waitForFailPoint": "failCommand",
                "timesEntered": self.entered_before + times,
                "maxTimeMS": within.as_millis() as i64,
            })
            .await
            .is_ok()
    }

    /// Turns the failpoint off; returns how many commands it failed (or held up), so that
    /// a test can show its fault really happened.
    pub async fn off(mut self) -> i64 {
        let entered = turn_off(&self.client).await;
        self.turned_off = true;
        entered.map_or(0, |entered| entered - self.entered_before)
    }
}

/// Turns `failCommand` off; returns the server's count of its entries so far.
async fn turn_off(client: &Client) -> Option<i64> {
    client
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .ok()
        .map(|answer| entry_count(&answer))
}

/// The `count` of a `configureFailPoint` answer: how often `failCommand` was entered
/// since mongod started (it is never reset).
fn entry_count(answer: &Document) -> i64 {
    answer
        .get_i64("count")
        .ok()
        .or_else(|| answer.get_i32("count").ok().map(i64::from))
        .unwrap_or(0)
}

impl Drop for FailPoint {
    fn drop(&mut self) {
        if self.turned_off {
            return;
        }
        // A test that panicked must not leave its failpoint on for the others: turned off
        // on a runtime of its own, whatever runtime the test was on, by a client of that
        // runtime (this one's tasks run on the test's runtime, blocked while we wait).
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to turn the failpoint off");
            runtime.block_on(async {
                let client = Client::with_uri_str(mongo_uri())
                    .await
                    .expect("admin client");
                turn_off(&client).await
            })
        })
        .join()
        .ok();
    }
}
