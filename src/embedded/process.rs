//! Child processes: mongod's clean shutdown, a child that dies with the process that
//! started it, and which mongod process a port is answered by.

use std::path::Path;

use mongodb::bson::doc;
use rustix::process::{self, Pid, Signal};
use tokio::process::Child;

use super::EmbeddedError;

/// Sends SIGTERM (mongod's clean shutdown) to `child` unless it has been reaped.
pub(super) fn terminate(child: &Child) {
    // tokio clears the id once the child is reaped, so the pid cannot belong to another
    // process; a child that exited meanwhile has nothing left to stop.
    if let Some(pid) = child.id().and_then(pid_of) {
        let _ = process::kill_process(pid, Signal::TERM);
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
        // Decided here, before the fork: the hook below only makes one system call.
        let signal = Signal::from_named_raw(signal);
        // SAFETY: the hook runs in the forked child before exec; prctl is
        // async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(move || {
                let signal = signal.ok_or(std::io::ErrorKind::InvalidInput)?;
                process::set_parent_process_death_signal(Some(signal))?;
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, signal);
}

/// The process id `pid` as the system calls take it (`None` for 0 or one out of range).
pub(super) fn pid_of(pid: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(pid).ok()?)
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
