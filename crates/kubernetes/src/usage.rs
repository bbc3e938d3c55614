//! A session pod's memory use, read where no metrics API is needed: the container's own
//! cgroup files through exec (`memory.current` and `memory.stat` on cgroup v2, their v1
//! names otherwise), as usage minus inactive file pages — the working set, as the kubelet
//! and the Docker backend count it, memory-backed emptyDir files included. The files are
//! read with absolute paths from the read-only image, and /sys/fs/cgroup is read-only to
//! the sandbox user, so a process in the pod cannot make the number up; what comes back is
//! still parsed strictly and a reply that does not parse is "cannot tell", never a guess.
//! CPU time is read the same way: `usage_usec` of `cpu.stat` (v2), or `cpuacct.usage` in
//! nanoseconds (v1).

use std::time::Duration;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::{ExecRequest, Sandbox, SandboxError, Usage};

use crate::KubeRuntime;

const READ: &str = "/bin/cat /sys/fs/cgroup/memory.current /sys/fs/cgroup/memory.stat 2>/dev/null \
    || /bin/cat /sys/fs/cgroup/memory/memory.usage_in_bytes /sys/fs/cgroup/memory/memory.stat";

/// Bytes in use: the first line (usage), less `inactive_file` (v2) or
/// `total_inactive_file` (v1) from the stat lines that follow.
pub(crate) fn parse(out: &str) -> Option<u64> {
    let mut lines = out.lines();
    let usage: u64 = lines.next()?.trim().parse().ok()?;
    let stat = |key: &str| -> Option<u64> {
        out.lines()
            .skip(1)
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let inactive = stat("inactive_file")
        .or_else(|| stat("total_inactive_file"))
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

const READ_CPU: &str = "/bin/cat /sys/fs/cgroup/cpu.stat 2>/dev/null \
    || { /bin/echo v1; /bin/cat /sys/fs/cgroup/cpuacct/cpuacct.usage; }";

/// Microseconds of CPU: `usage_usec` of a v2 `cpu.stat`, or a v1 `cpuacct.usage` (ns) after
/// the `v1` marker line.
pub(crate) fn parse_cpu(out: &str) -> Option<u64> {
    let mut lines = out.lines();
    if lines.next()?.trim() == "v1" {
        let ns: u64 = lines.next()?.trim().parse().ok()?;
        return Some(ns / 1000);
    }
    out.lines()
        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
}

/// The line between the CPU and the memory halves of `READ_BOTH`'s answer.
const SPLIT: &str = "@sandboxd-usage-split@";

/// The CPU reading, the split line, the memory reading: one exec for a usage reading.
fn read_both() -> String {
    format!("{{ {READ_CPU}; }}; /bin/echo {SPLIT}; {{ {READ}; }}")
}

/// Both halves of `read_both`'s answer, each parsed as alone (a half that does not parse is
/// "cannot tell" for that measure only).
pub(crate) fn parse_both(out: &str) -> Usage {
    let Some((cpu, memory)) = out.split_once(&format!("{SPLIT}\n")) else {
        return Usage::default();
    };
    Usage {
        cpu_usec: parse_cpu(cpu),
        memory_bytes: parse(memory),
    }
}

impl KubeRuntime {
    /// The pod's CPU time and working set from one exec.
    pub(crate) async fn read_usage(&self, pod: &str) -> Result<Usage, SandboxError> {
        let out = self.read_cgroup(pod, &read_both()).await?;
        Ok(out.as_deref().map(parse_both).unwrap_or_default())
    }

    /// The pod's CPU time in microseconds; None when the pod does not say.
    pub(crate) async fn read_cpu(&self, pod: &str) -> Result<Option<u64>, SandboxError> {
        let out = self.read_cgroup(pod, READ_CPU).await?;
        Ok(out.as_deref().and_then(parse_cpu))
    }

    /// What `script` prints in the pod, None if it failed or said too much.
    async fn read_cgroup(&self, pod: &str, script: &str) -> Result<Option<String>, SandboxError> {
        let sandbox = self.sandbox(pod.to_string(), pod, &Limits::default());
        let req = ExecRequest::new(["/bin/sh", "-c", script])
            .timeout(Duration::from_secs(10))
            .output_cap(64 * 1024);
        let out = sandbox.exec(req).await?;
        if out.exit_code != Some(0) || out.stdout_truncated {
            return Ok(None);
        }
        Ok(Some(out.stdout_lossy()))
    }

    /// The pod's working set in bytes; None when the pod does not say (no cgroup files).
    pub(crate) async fn read_memory(&self, pod: &str) -> Result<Option<u64>, SandboxError> {
        let out = self.read_cgroup(pod, READ).await?;
        Ok(out.as_deref().and_then(parse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_set_from_v2_and_v1_and_nothing_from_garbage() {
        assert_eq!(
            parse("1000000\nanon 5\nfile 7\ninactive_file 250000\nactive_file 3\n"),
            Some(750000)
        );
        assert_eq!(parse("900\ncache 1\ntotal_inactive_file 100\n"), Some(800));
        assert_eq!(parse("900\n"), Some(900));
        assert_eq!(parse("lots\ninactive_file 3\n"), None);
        assert_eq!(parse(""), None);
        // A key that only starts like ours is not ours.
        assert_eq!(parse("900\ninactive_filex 100\n"), Some(900));
    }

    #[test]
    fn one_reading_holds_both_halves_each_parsed_alone() {
        let both = format!("usage_usec 2500000\nuser_usec 1\n{SPLIT}\n900\ninactive_file 100\n");
        let u = parse_both(&both);
        assert_eq!((u.cpu_usec, u.memory_bytes), (Some(2_500_000), Some(800)));
        // A CPU half that failed (nothing printed) leaves the memory half.
        let u = parse_both(&format!("{SPLIT}\n900\n"));
        assert_eq!((u.cpu_usec, u.memory_bytes), (None, Some(900)));
        assert_eq!(parse_both("usage_usec 5\n900\n"), Usage::default());
        // The script runs both halves in one shell, the split line between them.
        let script = read_both();
        assert!(
            script.contains(READ_CPU) && script.contains(READ),
            "{script}"
        );
        assert!(script.find(READ_CPU) < script.find(SPLIT), "{script}");
    }

    #[test]
    fn cpu_time_from_v2_and_v1_and_nothing_from_garbage() {
        let v2 = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n";
        assert_eq!(parse_cpu(v2), Some(2_500_000));
        assert_eq!(parse_cpu("v1\n3000000000\n"), Some(3_000_000));
        assert_eq!(parse_cpu("v1\nlots\n"), None);
        assert_eq!(parse_cpu("user_usec 5\n"), None);
        assert_eq!(parse_cpu(""), None);
    }
}
