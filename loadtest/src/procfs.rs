//! Process measurements from `/proc` (Linux): a process's user and kernel CPU time
//! (`/proc/PID/stat` utime/stime) and resident memory (`/proc/PID/status` VmRSS/VmHWM), and
//! the open-files limit.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::time::Instant;

/// One reading of a process.
#[derive(Clone, Copy, Debug)]
pub struct ProcSample {
    /// When it was taken.
    pub at: Instant,
    /// User-mode CPU seconds so far.
    pub user_s: f64,
    /// Kernel-mode CPU seconds so far.
    pub sys_s: f64,
    /// Resident set size, KiB.
    pub rss_kib: u64,
    /// Peak resident set size, KiB.
    pub hwm_kib: u64,
}

/// CPU and memory of a process between two samples.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcDelta {
    /// Wall-clock seconds between the samples.
    pub wall_s: f64,
    /// User-mode CPU seconds used.
    pub user_s: f64,
    /// Kernel-mode CPU seconds used.
    pub sys_s: f64,
    /// `(user + sys) / wall`: 1.0 is one core busy.
    pub cores: f64,
    /// RSS at the first sample, KiB.
    pub rss_start_kib: u64,
    /// RSS at the second sample, KiB.
    pub rss_end_kib: u64,
    /// Peak RSS at the second sample (process lifetime), KiB.
    pub hwm_kib: u64,
}

impl ProcSample {
    /// What happened between `self` (earlier) and `later`.
    pub fn delta(&self, later: &ProcSample) -> ProcDelta {
        let wall_s = later.at.duration_since(self.at).as_secs_f64();
        let user_s = (later.user_s - self.user_s).max(0.0);
        let sys_s = (later.sys_s - self.sys_s).max(0.0);
        ProcDelta {
            wall_s,
            user_s,
            sys_s,
            cores: if wall_s > 0.0 {
                (user_s + sys_s) / wall_s
            } else {
                0.0
            },
            rss_start_kib: self.rss_kib,
            rss_end_kib: later.rss_kib,
            hwm_kib: later.hwm_kib,
        }
    }
}

/// Clock ticks per second of `/proc/PID/stat` times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Reads `/proc/<pid>` (`"self"` for this process).
///
/// # Errors
/// The process does not exist or its files cannot be parsed.
pub fn sample(pid: &str) -> Result<ProcSample> {
    let at = Instant::now();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime 15, num_threads 20.
    if fields.len() < 13 {
        bail!("short /proc/{pid}/stat");
    }
    let ticks = clock_ticks();
    let user_s = fields[11].parse::<f64>()? / ticks;
    let sys_s = fields[12].parse::<f64>()? / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(ProcSample {
        at,
        user_s,
        sys_s,
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
    })
}

/// This process, with CPU times from `getrusage` (microsecond resolution).
pub fn sample_self() -> ProcSample {
    let mut s = sample("self").unwrap_or(ProcSample {
        at: Instant::now(),
        user_s: 0.0,
        sys_s: 0.0,
        rss_kib: 0,
        hwm_kib: 0,
    });
    // SAFETY: getrusage writes into the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) == 0 {
            s.user_s = ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6;
            s.sys_s = ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6;
        }
    }
    s
}

/// A process to watch (the broker), or none.
#[derive(Clone, Debug)]
pub struct Probe {
    pid: Option<u32>,
}

impl Probe {
    /// Watches `pid` when given; checks that it exists.
    ///
    /// # Errors
    /// The process cannot be read.
    pub fn new(pid: Option<u32>) -> Result<Self> {
        if let Some(pid) = pid {
            sample(&pid.to_string()).with_context(|| format!("--broker-pid {pid}"))?;
        }
        Ok(Probe { pid })
    }

    /// A sample of the watched process (`None` without one, or once it is gone).
    pub fn sample(&self) -> Option<ProcSample> {
        self.pid.and_then(|p| sample(&p.to_string()).ok())
    }
}

/// Raises the soft open-files limit to the hard limit; returns `(before, after)`.
pub fn raise_nofile() -> (u64, u64) {
    let before = rlimit::getrlimit(rlimit::Resource::NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(0);
    let after = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(before);
    (before, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let a = sample_self();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = sample_self();
        assert!(a.rss_kib > 0);
        let d = a.delta(&b);
        assert!(d.user_s >= 0.0 && d.sys_s >= 0.0);
        let p = sample(&std::process::id().to_string()).unwrap();
        assert!(p.rss_kib > 0);
        assert!(Probe::new(Some(u32::MAX)).is_err());
    }
}
