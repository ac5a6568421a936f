//! What the embedded mongod's data directory records: the port the replica set was
//! configured with (remembered across restarts), and the pid of the mongod holding it.

use std::path::Path;

use rustix::io::Errno;
use rustix::process;

use super::EmbeddedError;
use super::process::pid_of;

pub(super) const PORT_FILE: &str = "tokenmint-port";
/// mongod writes its pid here while it holds the data directory, and empties it on a
/// clean shutdown.
const LOCK_FILE: &str = "mongod.lock";

/// The pid of a live mongod holding `data_dir` (written into its `mongod.lock`), if any.
/// A lock left behind by a crash names a dead process (or, rarely, a pid reused by
/// something that is not mongod) and counts as none.
pub fn running_mongod(data_dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(data_dir.join(LOCK_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if !process_alive(pid) {
        return None;
    }
    #[cfg(target_os = "linux")]
    if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        && !name.trim().starts_with("mongod")
    {
        return None;
    }
    Some(pid)
}

/// Whether process `pid` exists (also when it belongs to another user).
pub(super) fn process_alive(pid: u32) -> bool {
    let Some(pid) = pid_of(pid) else {
        return false;
    };
    // Signal 0 only checks that the process exists; another user's answers "not
    // permitted", which still means it is there.
    match process::test_kill_process(pid) {
        Ok(()) => true,
        Err(err) => err == Errno::PERM,
    }
}

pub(super) fn read_port(file: &Path) -> Option<u16> {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|p| p.trim().parse().ok())
}

/// The port recorded in `data_dir`, or a free one, recorded for next time.
pub(super) fn remembered_port(data_dir: &Path) -> Result<u16, EmbeddedError> {
    let file = data_dir.join(PORT_FILE);
    if let Some(port) = read_port(&file) {
        return Ok(port);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    std::fs::write(&file, port.to_string())?;
    Ok(port)
}
