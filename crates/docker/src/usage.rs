//! A container's CPU time and memory use, for every end, hibernation, metering sample and
//! memory budget read: from its cgroup files on this host when they are there (cgroup.rs,
//! which says why: the engine's stats wait for its collector's tick), else from one one-shot
//! stats answer of the engine, which answers both measures at once.

use std::path::Path;

use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::StatsOptionsBuilder;
use futures::StreamExt;
use sandboxd_core::sandbox::{SandboxError, Usage};

use crate::{DockerRuntime, cgroup, docker_err, engine_err};

/// Which source answered a reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageSource {
    /// The container's cgroup files on this host.
    HostCgroup,
    /// The engine's one-shot stats.
    StatsApi,
}

/// A usage reading and where it came from (the tests check which path a host takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageReading {
    pub usage: Usage,
    pub source: UsageSource,
}

/// How long the one `docker info` that learns the cgroup layout may take.
const INFO_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl DockerRuntime {
    /// Both measures, from the host's files when it can, else from the engine.
    pub async fn usage_reading(&self, handle: &str) -> Result<UsageReading, SandboxError> {
        if let Some(usage) = self.read_host(handle, HostRead::Both).await {
            return Ok(UsageReading {
                usage,
                source: UsageSource::HostCgroup,
            });
        }
        Ok(UsageReading {
            usage: self.stats_api_usage(handle).await?,
            source: UsageSource::StatsApi,
        })
    }

    /// Both measures from the engine's one-shot stats alone (the fallback).
    pub async fn stats_api_usage(&self, handle: &str) -> Result<Usage, SandboxError> {
        let stats = self.stats_once(handle, "read the container's CPU and memory use");
        Ok(stats.await?.as_ref().map(usage_of).unwrap_or_default())
    }

    /// The memory measure alone (the memory budget's reads).
    pub(crate) async fn memory_reading(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        if let Some(usage) = self.read_host(handle, HostRead::Memory).await {
            return Ok(usage.memory_bytes);
        }
        let stats = self.stats_once(handle, "read the container's memory use");
        Ok(stats.await?.as_ref().and_then(memory_of))
    }

    /// The CPU measure alone.
    pub(crate) async fn cpu_reading(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        if let Some(usage) = self.read_host(handle, HostRead::Cpu).await {
            return Ok(usage.cpu_usec);
        }
        let stats = self.stats_once(handle, "read the container's CPU use");
        Ok(stats.await?.as_ref().and_then(cpu_of))
    }

    /// The host's cgroup files of this engine, learned from `docker info` once; None when
    /// the engine's driver has no files, or this host has no such hierarchy (a remote
    /// engine on another cgroup version, sandboxd in a container of its own). An engine that
    /// does not answer is asked again next time.
    async fn host_cgroups(&self) -> Option<&cgroup::Host> {
        let learned = self.cgroups.get_or_try_init(|| async {
            // Bounded: callers queue behind this one, and an engine that takes connections
            // but does not answer would hold each of them for the client's whole timeout.
            let info = tokio::time::timeout(INFO_WAIT, self.docker.info())
                .await
                .map_err(|_| SandboxError::Timeout {
                    what: "the engine's info (for its cgroup layout)".into(),
                    after: INFO_WAIT,
                })?
                .map_err(engine_err)?;
            let driver = info
                .cgroup_driver
                .map(|d| d.to_string())
                .unwrap_or_default();
            let version = info.cgroup_version.map(|v| v.to_string());
            let root = Path::new(cgroup::CGROUP_ROOT);
            let host = cgroup::Host::from_info(root, &driver, version.as_deref().unwrap_or(""))
                .filter(cgroup::Host::mounted);
            tracing::debug!(?host, %driver, ?version, "usage readings' cgroup files");
            Ok::<_, SandboxError>(host)
        });
        learned.await.ok()?.as_ref()
    }

    /// A reading from the host's files, None (after saying why at debug) when they cannot
    /// give it: the caller asks the engine. Read off the async workers: files of sysfs are
    /// quick but still blocking reads.
    async fn read_host(&self, handle: &str, what: HostRead) -> Option<Usage> {
        let host = self.host_cgroups().await?.clone();
        let id = handle.to_string();
        let read = tokio::task::spawn_blocking(move || {
            let memory = match what {
                HostRead::Cpu => None,
                _ => Some(host.memory(&id)?),
            };
            let cpu = match what {
                HostRead::Memory => None,
                _ => Some(host.cpu_usec(&id)?),
            };
            Ok::<_, std::io::Error>(Usage {
                cpu_usec: cpu,
                memory_bytes: memory,
            })
        });
        match read.await {
            Ok(Ok(usage)) => Some(usage),
            Ok(Err(e)) => {
                tracing::debug!(handle, error = %e, "cgroup files unreadable; asking the engine");
                None
            }
            Err(e) => {
                tracing::debug!(handle, error = %e, "cgroup read failed; asking the engine");
                None
            }
        }
    }

    /// One reading of the container's stats (None: the engine sent none).
    async fn stats_once(
        &self,
        handle: &str,
        doing: &'static str,
    ) -> Result<Option<ContainerStatsResponse>, SandboxError> {
        let options = StatsOptionsBuilder::new()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stream = self.docker.stats(handle, Some(options));
        match stream.next().await {
            None => Ok(None),
            Some(stats) => stats.map(Some).map_err(|e| docker_err(doing, handle, e)),
        }
    }
}

/// Which measures a reading from the host takes.
#[derive(Clone, Copy)]
enum HostRead {
    Memory,
    Cpu,
    Both,
}

/// The cgroup's memory use without the reclaimable page cache, as `docker stats` shows.
fn memory_of(stats: &ContainerStatsResponse) -> Option<u64> {
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
fn cpu_of(stats: &ContainerStatsResponse) -> Option<u64> {
    let total = stats.cpu_stats.as_ref()?.cpu_usage.as_ref()?.total_usage?;
    Some(total / 1000)
}

/// Both, from the one answer.
fn usage_of(stats: &ContainerStatsResponse) -> Usage {
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

    /// cgroup.rs finds a container's files under the engine's default parent only.
    #[test]
    fn sessions_keep_the_engines_cgroup_parent() {
        let spec = sandboxd_core::sandbox::runtime::SandboxSpec {
            session_id: "s1".into(),
            owner: None,
            pooled: false,
            limits: sandboxd_core::config::Limits::default(),
            keep: false,
            replica: None,
            image: None,
            restore_bytes: None,
        };
        for oci in [None, Some("runsc")] {
            let body = crate::container_body("image", oci, &spec);
            let parent = body.host_config.and_then(|h| h.cgroup_parent);
            assert_eq!(parent, None, "{oci:?}");
        }
    }
}
