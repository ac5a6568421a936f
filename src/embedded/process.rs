//! Child processes: mongod's clean shutdown, a child that dies with the process that
//! started it, and which mongod process a port is answered by.

use std::path::Path;

use mongodb::bson::doc;
use tokio::process::Child;

use super::EmbeddedError;

/// Sends SIGTERM (mongod's clean shutdown) to `child` unless it has been reaped.
pub(super) fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: kill(2) on our own child, not reaped yet (tokio clears the id once it
        // is), so the pid cannot belong to another process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// On Linux, the child started by `command` gets `signal` when the thread that started it
/// dies, so a killed parent never leaves an orphan behind (a mongod holding its data
/// directory, a service still bound to its port). Elsewhere this does nothing.
///
/// Shared by every place that starts a child process: the embedded mongod, and the
/// bench's and the fault-injection tests' service and mongod processes.
pub fn die_with_parent(command: &mut std::process::Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, signal);
}

/// The pid of the mongod answering on `admin`'s connection (`serverStatus`), if it says.
pub(super) async fn server_pid(
    admin: &mongodb::Database,
) -> Result<Option<i64>, mongodb::error::Error> {
    let status = admin.run_command(doc! { "serverStatus": 1 }).await?;
    Ok(match status.get("pid") {
        Some(mongodb::bson::Bson::Int64(p)) => Some(*p),
        Some(mongodb::bson::Bson::Int32(p)) => Some(i64::from(*p)),
        _ => None,
    })
}

/// The server on `port` is not the mongod `pid` holding `data_dir`.
pub(super) fn not_ours(
    port: u16,
    pid: u32,
    data_dir: &Path,
    answering: Option<i64>,
) -> EmbeddedError {
    EmbeddedError::NotOurs {
        port,
        pid,
        data_dir: data_dir.to_path_buf(),
        found: answering.map_or_else(
            || "a server that does not tell its pid".to_owned(),
            |p| format!("a mongod with pid {p}"),
        ),
    }
}
