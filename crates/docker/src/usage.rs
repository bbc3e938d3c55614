//! A container's CPU time and memory use, read from one one-shot stats answer of the
//! engine: a usage reading (every end, hibernation and metering sample) needs both, and one
//! call answers both.

use bollard::models::ContainerStatsResponse;
use sandboxd_core::sandbox::Usage;

/// The cgroup's memory use without the reclaimable page cache, as `docker stats` shows.
pub(crate) fn memory_of(stats: &ContainerStatsResponse) -> Option<u64> {
    let m = stats.memory_stats.as_ref()?;
    // cgroup v2 names it inactive_file, v1 total_inactive_file.
    let inactive = m
        .stats
        .as_ref()
        .and_then(|s| {
            s.get("inactive_file")
                .or_else(|| s.get("total_inactive_file"))
        })
        .copied()
        .unwrap_or(0);
    m.usage.map(|u| u.saturating_sub(inactive))
}

/// The cgroup's CPU time (the engine counts nanoseconds; metering keeps microseconds).
pub(crate) fn cpu_of(stats: &ContainerStatsResponse) -> Option<u64> {
    let total = stats.cpu_stats.as_ref()?.cpu_usage.as_ref()?.total_usage?;
    Some(total / 1000)
}

/// Both, from the one answer.
pub(crate) fn usage_of(stats: &ContainerStatsResponse) -> Usage {
    Usage {
        cpu_usec: cpu_of(stats),
        memory_bytes: memory_of(stats),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerCpuStats, ContainerCpuUsage, ContainerMemoryStats};
    use std::collections::HashMap;

    #[test]
    fn both_measures_come_from_one_answer() {
        let stats = ContainerStatsResponse {
            cpu_stats: Some(ContainerCpuStats {
                cpu_usage: Some(ContainerCpuUsage {
                    total_usage: Some(2_500_000_000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(1_000_000),
                stats: Some(HashMap::from([("inactive_file".to_string(), 250_000)])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let u = usage_of(&stats);
        assert_eq!(u.cpu_usec, Some(2_500_000));
        assert_eq!(u.memory_bytes, Some(750_000));
        assert_eq!(
            usage_of(&ContainerStatsResponse::default()),
            Usage::default()
        );
    }
}
