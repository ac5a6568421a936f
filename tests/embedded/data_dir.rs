//! The embedded mongod's data directory as the tests see it: the configuration that
//! points at it, the lock and port files mongod and tokenmint leave there, and whether a
//! mongod still runs on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokenmint::http::auth::key_hash;
use tokenmint_test_support::mongod_binary;

use super::KEY;

/// The test configuration: the embedded mongod on `data_dir`, port 0, `server` lines
/// added to `[server]`, and the test key unless `with_key` is false.
pub(super) fn config_text(data_dir: &Path, server: &str, with_key: bool) -> String {
    let mut config = format!(
        r#"[server]
bind = "127.0.0.1:0"
{server}

[mongo]
uri = ""
database = "tokenmint_embedded_test"

[mongo.embedded]
binary = "{binary}"
data_dir = "{data}"
"#,
        binary = mongod_binary().display(),
        data = data_dir.display(),
    );
    if with_key {
        config.push_str(&format!(
            "\n[[auth.keys]]\nid = \"e2e-admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n",
            key_hash(KEY)
        ));
    }
    config
}

pub(super) fn write_config_with(
    dir: &Path,
    data_dir: &Path,
    server: &str,
    with_key: bool,
) -> PathBuf {
    let path = dir.join("tokenmint.toml");
    std::fs::write(&path, config_text(data_dir, server, with_key)).unwrap();
    path
}

pub(super) fn write_config(dir: &Path, data_dir: &Path) -> PathBuf {
    write_config_with(dir, data_dir, "", true)
}

/// The pid in the data directory's `mongod.lock`: the mongod holding it, if one runs.
pub(super) fn lock_pid(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("mongod.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub(super) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(libc::pid_t::try_from(pid).unwrap(), 0) == 0 }
}

/// The port the embedded mongod of `data_dir` uses.
pub(super) fn mongod_port(data_dir: &Path) -> u16 {
    std::fs::read_to_string(data_dir.join("tokenmint-port"))
        .expect("the port is remembered in the data directory")
        .trim()
        .parse()
        .unwrap()
}

/// Asserts that nothing listens on the embedded mongod's port any more and that mongod
/// released its data directory cleanly (an empty `mongod.lock`).
pub(super) fn assert_mongod_stopped(data_dir: &Path) {
    let port = mongod_port(data_dir);
    let refused = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .is_err();
    assert!(refused, "mongod still accepts connections on port {port}");
    let lock = std::fs::metadata(data_dir.join("mongod.lock")).expect("mongod.lock exists");
    assert_eq!(lock.len(), 0, "a clean shutdown leaves mongod.lock empty");
    let holders = processes_naming(data_dir);
    assert!(
        holders.is_empty(),
        "still running on {data_dir:?}: {holders:?}"
    );
}

/// Command lines of live processes that mention `path` (Linux /proc).
pub(super) fn processes_naming(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle))
        .collect()
}
