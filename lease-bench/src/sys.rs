//! CPU time, resident memory and a description of the machine, from the
//! kernel (`getrusage`, `/proc`).

use std::time::{Duration, SystemTime};

use serde::Serialize;

/// CPU time (user + system) of this process so far.
pub fn cpu_self() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time (user + system) of another process, from `/proc/<pid>/stat`.
pub fn cpu_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): state is field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(Duration::from_secs_f64((utime + stime) as f64 / hz))
}

/// Resident set size in bytes of `pid` (None: this process).
pub fn rss(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub date_utc: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_average: String,
    /// The load average when the run ended.
    pub load_average_end: String,
    /// The most compiler processes (`rustc`) seen running beside the
    /// bench, sampled at the start and end of every section.
    pub builds_seen: usize,
}

/// Compiler processes (`rustc`) running now: other work sharing the
/// machine's CPUs with the bench.
pub fn builds_running() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|c| c.trim() == "rustc")
        .count()
}

/// The load average now (1, 5 and 15 minutes).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let load_average = load_average();
    Machine {
        date_utc: utc_now(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        memory_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel,
        load_average_end: load_average.clone(),
        load_average,
        builds_seen: builds_running(),
    }
}

/// `YYYY-MM-DD HH:MM UTC` for now.
pub fn utc_now() -> String {
    let t = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    // `YYYY-MM-DDTHH:MM:SSZ` → `YYYY-MM-DD HH:MM UTC`
    match (t.get(..10), t.get(11..16)) {
        (Some(day), Some(hm)) => format!("{day} {hm} UTC"),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_measurable() {
        assert!(rss(None).unwrap() > 0);
        let pid = std::process::id();
        assert!(cpu_of(pid).is_some());
        let m = machine();
        assert!(m.cpus >= 1);
        assert!(
            m.date_utc.ends_with("UTC") && m.date_utc.len() == 20,
            "{}",
            m.date_utc
        );
    }
}
