//! The process metrics every Prometheus client exports (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`), read from /proc at each scrape:
//! `prometheus-client` has no process collector. Off Linux (no /proc) they are absent.
//!
//! CPU time and the start time are in clock ticks in /proc; Linux reports them in USER_HZ,
//! which is 100 on every architecture it exports to user space.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

const USER_HZ: f64 = 100.0;

#[derive(Debug)]
pub(super) struct Process;

/// What one scrape read.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    start_ticks: u64,
    virtual_bytes: u64,
    resident_bytes: u64,
}

/// The fields of /proc/self/stat after the command name (which may hold spaces and
/// parentheses, so the split is at the last `)`), and VmRSS of /proc/self/status.
fn parse(stat: &str, status: &str) -> Option<Reading> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state): utime is field 14, i.e. index 11 here.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    let cpu_ticks = num(11)? + num(12)?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Some(Reading {
        cpu_seconds: cpu_ticks as f64 / USER_HZ,
        start_ticks: num(19)?,
        virtual_bytes: num(20)?,
        resident_bytes: rss_kb * 1024,
    })
}

/// The boot time (unix seconds) from /proc/stat's `btime`.
fn boot_time() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for Process {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let Some(r) = parse(&stat, &status) else {
            return Ok(());
        };
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        gauge(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            r.resident_bytes as f64,
        )?;
        gauge(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            r.virtual_bytes as f64,
        )?;
        if let Some(n) = open_fds() {
            // The read_dir handle itself was one of them.
            gauge(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors",
                n.saturating_sub(1) as f64,
            )?;
        }
        if let Some(n) = crate::listen::nofile::soft_limit() {
            gauge(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                n as f64,
            )?;
        }
        if let Some(boot) = boot_time() {
            let start = boot as f64 + r.start_ticks as f64 / USER_HZ;
            gauge(
                &mut enc,
                "process_start_time_seconds",
                "Start time of the process since the unix epoch in seconds",
                start,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_skipped() {
        let stat = "4242 (sandboxd (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 12345 1048576 300 18446744073709551615";
        let status = "Name:\tsandboxd\nVmRSS:\t   2048 kB\n";
        let r = parse(stat, status).unwrap();
        assert_eq!(
            r,
            Reading {
                cpu_seconds: 3.0,
                start_ticks: 12345,
                virtual_bytes: 1_048_576,
                resident_bytes: 2048 * 1024,
            }
        );
        assert_eq!(parse("garbage", ""), None);
    }

    #[test]
    fn this_process_reads() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let r = parse(&stat, &status).unwrap();
        assert!(
            r.resident_bytes > 0 && r.virtual_bytes >= r.resident_bytes,
            "{r:?}"
        );
        assert!(open_fds().unwrap() >= 3);
    }
}
