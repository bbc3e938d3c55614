//! A container's CPU time and memory use read from its cgroup files on this host, the fast
//! path of every usage reading (usage.rs falls back to the engine's stats when it fails).
//!
//! Why not only the engine: Docker 20.10's one-shot stats answer from its global stats
//! collector, which samples every container once a second; a call within a second of any
//! other stats call (of any container) waits for the collector's next tick, 0.7–1.0 s. A
//! DELETE's final reading, a hibernation's and the memory budget's reads all paid it. The
//! kernel's files answer the same numbers in microseconds.
//!
//! Trust: the files are read by sandboxd from this host's /sys/fs/cgroup, where only the
//! kernel writes them; never through the sandbox (whose processes could forge anything they
//! print). Where they are not (a remote engine, a cgroup parent or layout other than the
//! engine's default, a rootless engine, unreadable files) a reading fails and the caller asks
//! the engine instead. The layout (driver and version) is learned once from `docker info`.
//!
//! The meanings are the engine's: memory is the usage without the inactive file cache (as
//! `docker stats` shows it), CPU the cgroup's total time in microseconds.

use std::io;
use std::path::{Path, PathBuf};

/// Where the host mounts the cgroup hierarchies.
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup version the engine runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    /// One hierarchy per controller: memory/ and cpuacct/.
    V1,
    /// The unified hierarchy: one directory per cgroup.
    V2,
}

/// How the engine names a container's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Driver {
    /// `docker/<id>`.
    Cgroupfs,
    /// `system.slice/docker-<id>.scope`.
    Systemd,
}

/// The cgroup files of this host's engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    root: PathBuf,
    version: Version,
    driver: Driver,
}

impl Host {
    /// From `docker info`'s CgroupDriver and CgroupVersion; None for a driver without cgroup
    /// paths of its own ("none", or one this code does not know). An engine that does not
    /// say its version predates cgroup v2 support (API < 1.40), so it is v1.
    pub(crate) fn from_info(root: &Path, driver: &str, version: &str) -> Option<Self> {
        let driver = match driver {
            "cgroupfs" => Driver::Cgroupfs,
            "systemd" => Driver::Systemd,
            _ => return None,
        };
        let version = match version {
            "2" => Version::V2,
            "1" | "" => Version::V1,
            _ => return None,
        };
        Some(Self {
            root: root.to_path_buf(),
            version,
            driver,
        })
    }

    /// Whether this host has the hierarchy the engine says it uses: not so when the engine
    /// runs elsewhere on another version, or sandboxd in a container of its own.
    pub(crate) fn mounted(&self) -> bool {
        match self.version {
            Version::V1 => {
                self.root.join("memory/memory.stat").exists()
                    && self.root.join("cpuacct/cpuacct.usage").exists()
            }
            Version::V2 => self.root.join("cgroup.controllers").exists(),
        }
    }

    /// Where the container's files of a controller are (the controller only counts in v1);
    /// None unless `id` is a full container id, so no handle can name another path.
    fn dir(&self, controller: &str, id: &str) -> Option<PathBuf> {
        if !is_full_id(id) {
            return None;
        }
        let mut dir = self.root.clone();
        if self.version == Version::V1 {
            dir.push(controller);
        }
        match self.driver {
            Driver::Cgroupfs => dir.push(format!("docker/{id}")),
            Driver::Systemd => dir.push(format!("system.slice/docker-{id}.scope")),
        }
        Some(dir)
    }

    /// The container's memory use without the inactive file cache, in bytes.
    pub(crate) fn memory(&self, id: &str) -> io::Result<u64> {
        let dir = self.dir("memory", id).ok_or_else(not_an_id)?;
        let (usage, stat) = match self.version {
            Version::V1 => ("memory.usage_in_bytes", "memory.stat"),
            Version::V2 => ("memory.current", "memory.stat"),
        };
        let usage = read(&dir.join(usage))?;
        let stat = read(&dir.join(stat))?;
        let memory = match self.version {
            Version::V1 => memory_v1(&usage, &stat),
            Version::V2 => memory_v2(&usage, &stat),
        };
        memory.ok_or_else(|| unreadable(&dir))
    }

    /// The container's CPU time, in microseconds.
    pub(crate) fn cpu_usec(&self, id: &str) -> io::Result<u64> {
        let dir = self.dir("cpuacct", id).ok_or_else(not_an_id)?;
        let cpu = match self.version {
            Version::V1 => cpu_v1(&read(&dir.join("cpuacct.usage"))?),
            Version::V2 => cpu_v2(&read(&dir.join("cpu.stat"))?),
        };
        cpu.ok_or_else(|| unreadable(&dir))
    }
}

/// A full container id: 64 lowercase hex digits, what the engine's create and list answer.
fn is_full_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A cgroup file, bounded: memory.stat is about 1 KiB, the others a line.
fn read(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(64 * 1024)
        .read_to_string(&mut text)?;
    Ok(text)
}

fn not_an_id() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a full container id")
}

fn unreadable(dir: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected cgroup file contents in {}", dir.display()),
    )
}

/// A file holding one number (memory.usage_in_bytes, memory.current, cpuacct.usage).
fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A `key value` line's value in a flat-keyed file (memory.stat, cpu.stat).
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

/// v1: memory.usage_in_bytes less memory.stat's total_inactive_file (the hierarchy's, which
/// `docker stats` takes on v1; inactive_file if a kernel lacks it).
pub(crate) fn memory_v1(usage_in_bytes: &str, stat: &str) -> Option<u64> {
    let inactive = field(stat, "total_inactive_file").or_else(|| field(stat, "inactive_file"));
    Some(number(usage_in_bytes)?.saturating_sub(inactive.unwrap_or(0)))
}

/// v2: memory.current less memory.stat's inactive_file.
pub(crate) fn memory_v2(current: &str, stat: &str) -> Option<u64> {
    let inactive = field(stat, "inactive_file").unwrap_or(0);
    Some(number(current)?.saturating_sub(inactive))
}

/// v1: cpuacct.usage counts nanoseconds.
pub(crate) fn cpu_v1(cpuacct_usage: &str) -> Option<u64> {
    Some(number(cpuacct_usage)? / 1000)
}

/// v2: cpu.stat's usage_usec.
pub(crate) fn cpu_v2(cpu_stat: &str) -> Option<u64> {
    field(cpu_stat, "usage_usec")
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
