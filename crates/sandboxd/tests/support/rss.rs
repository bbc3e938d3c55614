//! Host memory of the test process, read from /proc: the peak (VmHWM) since a reset, so a
//! test can say what one attack cost the host. Tests that measure must not overlap, since
//! they share one process: each holds `SERIAL` while it measures.

use tokio::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::const_new(());

/// A measurement in progress; `finish` returns the peak growth over the resident size at start.
pub struct Peak {
    start_kib: u64,
    _serial: MutexGuard<'static, ()>,
}

fn status_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

impl Peak {
    /// Waits for other measuring tests, then resets the peak to the current resident size
    /// (writing 5 to /proc/self/clear_refs, Linux ≥ 4.0).
    pub async fn start() -> Peak {
        let serial = SERIAL.lock().await;
        std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
        Peak {
            start_kib: status_kib("VmRSS:"),
            _serial: serial,
        }
    }

    /// The peak resident size since `start`, minus the resident size at `start`, in MiB.
    pub fn growth_mib(&self) -> u64 {
        status_kib("VmHWM:").saturating_sub(self.start_kib) / 1024
    }

    /// The peak resident size since `start`, in MiB.
    pub fn peak_mib(&self) -> u64 {
        status_kib("VmHWM:") / 1024
    }
}

/// The same measurement of another process (a `serve` the test started): its peak resident
/// size since `start`, from /proc/<pid>. Serialized with `Peak` too.
pub struct PidPeak {
    pid: u32,
    start_kib: u64,
    _serial: MutexGuard<'static, ()>,
}

fn pid_status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

impl PidPeak {
    /// Resets `pid`'s peak to its current resident size (needs the right to write its
    /// clear_refs: the same user, as a test's child is).
    pub async fn start(pid: u32) -> PidPeak {
        let serial = SERIAL.lock().await;
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
        PidPeak {
            pid,
            start_kib: pid_status_kib(pid, "VmRSS:"),
            _serial: serial,
        }
    }

    /// The resident size at `start`, in MiB.
    pub fn start_mib(&self) -> u64 {
        self.start_kib / 1024
    }

    /// The peak resident size since `start`, minus the resident size at `start`, in MiB.
    pub fn growth_mib(&self) -> u64 {
        pid_status_kib(self.pid, "VmHWM:").saturating_sub(self.start_kib) / 1024
    }

    /// The peak resident size since `start`, in MiB.
    pub fn peak_mib(&self) -> u64 {
        pid_status_kib(self.pid, "VmHWM:") / 1024
    }
}
