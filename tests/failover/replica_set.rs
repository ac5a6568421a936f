//! The replica set the failover scenarios run on: three mongods of the pinned binary on
//! loopback, member 0 with priority 2, and the means to step down, pause and kill members.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use mongodb::Client;
use mongodb::bson::{Bson, doc};
use mongodb::options::ClientOptions;
use tokenmint::embedded::die_with_parent;
use tokenmint_test_support::mongod_binary;

const REPLICA_SET: &str = "rs0";

struct Member {
    port: u16,
    dbpath: PathBuf,
    child: Option<Child>,
    /// A direct connection (no discovery) for probing this member.
    client: Client,
}

/// Three mongods on loopback with temporary data; all SIGKILLed and reaped on drop.
pub(super) struct ReplicaSet {
    binary: PathBuf,
    members: Vec<Member>,
    dir: Option<tempfile::TempDir>,
}

fn free_ports(n: usize) -> Vec<u16> {
    // Held together so they are distinct; released just before mongod binds them.
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A direct client to one member, failing fast (a probe must not hang on a dead member).
async fn direct_client(port: u16) -> Client {
    let mut options =
        ClientOptions::parse(format!("mongodb://127.0.0.1:{port}/?directConnection=true"))
            .await
            .unwrap();
    options.server_selection_timeout = Some(Duration::from_millis(500));
    options.connect_timeout = Some(Duration::from_millis(500));
    Client::with_options(options).unwrap()
}

/// Index of the member that says it is the writable primary, asking all at once.
pub(super) async fn probe_primary(clients: &[Client]) -> Option<usize> {
    let answers = join_all(clients.iter().map(|client| async move {
        client
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
            .ok()
            .is_some_and(|hello| hello.get_bool("isWritablePrimary").unwrap_or(false))
    }))
    .await;
    answers.iter().position(|primary| *primary)
}

impl ReplicaSet {
    pub(super) async fn start() -> ReplicaSet {
        let dir = tempfile::tempdir().unwrap();
        let mut members = Vec::new();
        for (i, port) in free_ports(3).into_iter().enumerate() {
            let dbpath = dir.path().join(format!("m{i}"));
            std::fs::create_dir_all(&dbpath).unwrap();
            members.push(Member {
                port,
                dbpath,
                child: None,
                client: direct_client(port).await,
            });
        }
        let mut set = ReplicaSet {
            binary: mongod_binary(),
            members,
            dir: Some(dir),
        };
        for i in 0..3 {
            set.spawn(i);
        }
        set.initiate().await;
        set
    }

    pub(super) fn spawn(&mut self, i: usize) {
        let member = &mut self.members[i];
        let mut command = Command::new(&self.binary);
        command
            .args(["--replSet", REPLICA_SET, "--bind_ip", "127.0.0.1", "--port"])
            .arg(member.port.to_string())
            .arg("--dbpath")
            .arg(&member.dbpath)
            .arg("--logpath")
            .arg(member.dbpath.join("mongod.log"))
            .arg("--logappend")
            .args(["--setParameter", "diagnosticDataCollectionEnabled=false"])
            // For `failCommand`, which holds one command where a scenario needs it.
            .args(["--setParameter", "enableTestCommands=1"])
            .args(["--wiredTigerCacheSizeGB", "0.25", "--oplogSize", "256"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SIGKILL if the test process dies first.
        die_with_parent(&mut command, libc::SIGKILL);
        member.child = Some(command.spawn().expect("mongod starts"));
    }

    pub(super) fn uri(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("mongodb://{}/?replicaSet={REPLICA_SET}", hosts.join(","))
    }

    /// A URI that reaches member `i` alone (`directConnection=true`), whatever it is.
    pub(super) fn direct_uri(&self, i: usize) -> String {
        format!(
            "mongodb://127.0.0.1:{}/?directConnection=true",
            self.members[i].port
        )
    }

    pub(super) fn clients(&self) -> Vec<Client> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// Member 0 has priority 2 so it is elected first (and takes over again when it can).
    /// It is asked to step up at once instead of waiting out the 10 s election timeout.
    pub(super) async fn initiate(&self) {
        let members: Vec<Bson> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Bson::Document(doc! {
                    "_id": i as i32,
                    "host": format!("127.0.0.1:{}", m.port),
                    "priority": if i == 0 { 2 } else { 1 },
                })
            })
            .collect();
        let config = doc! { "_id": REPLICA_SET, "members": members };
        let admin = self.members[0].client.database("admin");
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(err) = admin
            .run_command(doc! { "replSetInitiate": config.clone() })
            .await
        {
            assert!(Instant::now() < deadline, "replSetInitiate: {err}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        while self.primary().await.is_none() {
            assert!(
                Instant::now() < deadline,
                "no primary after replSetInitiate"
            );
            let _ = admin.run_command(doc! { "replSetStepUp": 1 }).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.wait_until_healthy(Duration::from_secs(90)).await;
    }

    pub(super) async fn primary(&self) -> Option<usize> {
        probe_primary(&self.clients()).await
    }

    /// Waits for a primary and for every running member to be PRIMARY or SECONDARY.
    pub(super) async fn wait_until_healthy(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(primary) = self.primary().await {
                let status = self.members[primary]
                    .client
                    .database("admin")
                    .run_command(doc! { "replSetGetStatus": 1 })
                    .await;
                let running = self.members.iter().filter(|m| m.child.is_some()).count();
                let healthy = status
                    .ok()
                    .and_then(|s| s.get_array("members").ok().cloned())
                    .map(|members| {
                        members
                            .iter()
                            .filter_map(Bson::as_document)
                            .filter(|m| matches!(m.get_i32("state"), Ok(1) | Ok(2)))
                            .count()
                    });
                if healthy == Some(running) {
                    return primary;
                }
            }
            assert!(
                Instant::now() < deadline,
                "replica set not healthy within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `replSetStepDown` (forced) on member `i`. The server may close the connection
    /// while stepping down, so the answer is not checked; the timeline shows the result.
    pub(super) async fn step_down(&self, i: usize) {
        let _ = self.members[i]
            .client
            .database("admin")
            .run_command(doc! { "replSetStepDown": 10, "force": true })
            .await;
    }

    /// SIGSTOP / SIGCONT member `i`: a paused member is a member that stopped replicating.
    pub(super) fn signal(&self, i: usize, signal: i32) {
        let child = self.members[i].child.as_ref().expect("member running");
        // SAFETY: signalling a child process we started and have not reaped yet.
        let rc = unsafe { libc::kill(child.id() as i32, signal) };
        assert_eq!(rc, 0, "signal {signal} to mongod {i}");
    }

    pub(super) fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            // SAFETY: signalling a child process we started and have not reaped yet.
            let rc = unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            assert_eq!(rc, 0, "kill mongod {i}");
            child.wait().unwrap();
        }
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::env::var_os("TOKENMINT_FAILOVER_KEEP").is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("replica set data and logs kept in {}", dir.keep().display());
        }
    }
}
