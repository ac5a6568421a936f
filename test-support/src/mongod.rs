//! The test mongod and database handles on it.
//!
//! One mongod per test binary (started on first use, unless `TOKENMINT_TEST_MONGO_URI`
//! names a replica set to use instead), from the pinned binary under `.tools/`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mongodb::Client;
use tokenmint::embedded::EmbeddedMongo;
use tokenmint::settings::EmbeddedMongoSettings;
use tokenmint::store::Store;

use crate::app::test_settings_at;

/// The workspace's root: where `config/`, `.tools/` and the `tokenmint` package live.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support sits in the workspace root")
}

/// Cargo's target directory of the running test binary, which lives in
/// `<target>/<profile>/deps/`. (A library has no `CARGO_TARGET_TMPDIR`: cargo sets it for
/// integration tests only, so the path is taken from the running executable.)
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("a test binary under <target>/<profile>/deps")
        .to_path_buf()
}

/// The pinned mongod that `scripts/install-mongod.sh` installs; panics with the fix when
/// it is missing.
pub fn mongod_binary() -> PathBuf {
    let binary = workspace_root().join(".tools/mongodb/bin/mongod");
    assert!(
        binary.is_file(),
        "{} is missing: run scripts/install-mongod.sh",
        binary.display()
    );
    binary
}

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
            let tmp = target_dir().join("tmp");
            std::fs::create_dir_all(&tmp).expect("the target's tmp directory");
            remove_stale_data_dirs(&tmp, &stem);
            // The pid keeps concurrent runs of the same test binary apart.
            let data_dir = tmp.join(format!("mongo-{stem}-{}", std::process::id()));
            let settings = EmbeddedMongoSettings {
                binary: mongod_binary().to_string_lossy().into_owned(),
                data_dir,
            };
            // Test commands let a test make one command fail or hang (`failpoint`).
            match EmbeddedMongo::start_with_parameters(&settings, &["enableTestCommands=1"]).await {
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
fn remove_stale_data_dirs(tmp: &Path, stem: &str) {
    let prefix = format!("mongo-{stem}-");
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&prefix) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A store on `database` of the deployment at `uri`, connected as the service connects
/// with its default settings (a longer server selection timeout: a check may follow a
/// failover), for `verify` and direct reads.
pub async fn connect_store(uri: &str, database: &str) -> Store {
    let settings = test_settings_at(
        uri,
        database,
        "[mongo]\nserver_selection_timeout_ms = 10000\n",
    );
    let (store, _) = tokenmint::startup::connect(&settings)
        .await
        .expect("store connects");
    store
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

/// A store on a fresh, randomly named database of the test mongod (`prefix` and a uuid),
/// dropped with this value, also when the test fails.
pub struct ScratchDatabase(Store);

impl ScratchDatabase {
    /// Connects a store to a new database named `<prefix>_<uuid>`.
    pub async fn create(prefix: &str) -> ScratchDatabase {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        ScratchDatabase(connect_store(&mongo_uri(), &name).await)
    }

    /// The store on this database.
    pub fn store(&self) -> &Store {
        &self.0
    }

    /// This database's name.
    pub fn name(&self) -> &str {
        self.0.database().name()
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        drop_database_blocking(self.name());
    }
}
