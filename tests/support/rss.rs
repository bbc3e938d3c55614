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
