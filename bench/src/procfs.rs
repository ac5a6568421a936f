//! What the bench reads from /proc: CPU time of a process (utime + stime from
//! /proc/<pid>/stat), its resident memory (VmRSS from /proc/<pid>/status), finding the
//! mongod of a data directory, and a description of the machine.

use std::path::Path;
use std::time::Duration;

/// The process whose CPU the bench reads: a PID, or the bench itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    Id(u32),
    Myself,
}

impl Pid {
    fn dir(self) -> String {
        match self {
            Pid::Id(pid) => format!("/proc/{pid}"),
            Pid::Myself => "/proc/self".to_owned(),
        }
    }
}

/// user + system CPU time the process has used so far (all threads, not children).
pub fn cpu_time(pid: Pid) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("{}/stat", pid.dir())).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after
    // the last ')'. There, field 3 (state) is index 0, so utime (14) is 11, stime 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = clock_ticks_per_second();
    let total = utime + stime;
    Some(
        Duration::from_secs(total / ticks)
            + Duration::from_nanos((total % ticks) * 1_000_000_000 / ticks),
    )
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is touched.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// VmRSS in bytes.
pub fn resident_bytes(pid: Pid) -> Option<u64> {
    let status = std::fs::read_to_string(format!("{}/status", pid.dir())).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The PID of the mongod whose command line has `--dbpath <data_dir>`.
pub fn find_mongod_by_dbpath(data_dir: &Path) -> Option<u32> {
    let wanted = data_dir.as_os_str().as_encoded_bytes();
    processes().find_map(|(pid, cmdline)| {
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_mongod = args.first().is_some_and(|a| a.ends_with(b"mongod"));
        let has_dir = args
            .windows(2)
            .any(|w| w[0] == b"--dbpath" && w[1] == wanted);
        (is_mongod && has_dir).then_some(pid)
    })
}

/// The PID of the only process called `mongod`, if there is exactly one.
pub fn find_single_mongod() -> Option<u32> {
    let found: Vec<u32> = processes()
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "mongod")
        })
        .map(|(pid, _)| pid)
        .collect();
    match found.as_slice() {
        [pid] => Some(*pid),
        _ => None,
    }
}

fn processes() -> impl Iterator<Item = (u32, Vec<u8>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            Some((pid, cmdline))
        })
}

/// The machine, as docs/BENCHMARKS.md describes it: cores, CPU model, memory, kernel.
pub fn machine_description() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, m)| m.trim())
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "nproc {cores}, CPU \"{model}\", {:.1} GiB memory, Linux {}",
        mem_kib as f64 / (1024.0 * 1024.0),
        kernel.trim()
    )
}

/// The 1-, 5- and 15-minute load averages, as /proc/loadavg shows them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}
