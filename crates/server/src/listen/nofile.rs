//! The open-file limit: `serve` raises its soft limit to the hard one at start, and keeps
//! client connections to half of it, so that a flood of connections cannot leave the process
//! without descriptors for the Docker socket, the store and the sandboxes' streams ("Too many
//! open files" stopped every answer, Docker calls included, before).
//!
//! rustix rather than libc: both are already in the tree, and rustix's `getrlimit` and
//! `setrlimit` are safe functions, so the crate stays free of `unsafe`.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The most a soft limit can be when the hard one is "unlimited" (Linux's default
/// `fs.nr_open`; a soft limit above the kernel's `nr_open` is refused).
const NR_OPEN_DEFAULT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[error(
    "cannot raise the open-file limit from {from} to {to}: {source}; set LimitNOFILE= in the systemd unit (deploy/sandboxd-serve.service) or `ulimit -n` before starting"
)]
pub struct RaiseError {
    from: u64,
    to: u64,
    source: std::io::Error,
}

/// The soft open-file limit now (`None`: unlimited).
pub fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// Raises the soft open-file limit to the hard one; returns (before, after).
pub fn raise_soft_to_hard() -> Result<(Option<u64>, Option<u64>), RaiseError> {
    let now = getrlimit(Resource::Nofile);
    let target = now.maximum.unwrap_or(nr_open());
    match now.current {
        Some(soft) if soft < target => {}
        // Already at (or above) what can be had.
        _ => return Ok((now.current, now.current)),
    }
    let raised = Rlimit {
        current: Some(target),
        maximum: now.maximum,
    };
    setrlimit(Resource::Nofile, raised).map_err(|e| RaiseError {
        from: now.current.unwrap_or(u64::MAX),
        to: target,
        source: e.into(),
    })?;
    Ok((now.current, soft_limit()))
}

/// The kernel's ceiling for one process's open files.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(NR_OPEN_DEFAULT)
}

/// The connection cap in force: the configured one, but at most half the open-file limit.
/// Every request in flight may hold more descriptors of its own (a Docker API connection, an
/// exec's attach stream, a temp file), and the store, the engine and the sandboxes' bridges
/// need theirs whatever the clients do.
pub fn connection_cap(configured: u64, soft_limit: Option<u64>) -> usize {
    let room = soft_limit.map_or(u64::MAX, |n| (n / 2).max(1));
    usize::try_from(configured.min(room).max(1)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_half_the_descriptors_to_the_rest_of_the_process() {
        assert_eq!(connection_cap(1024, Some(65_536)), 1024);
        assert_eq!(connection_cap(1024, Some(1024)), 512);
        assert_eq!(connection_cap(64, Some(256)), 64);
        assert_eq!(connection_cap(1024, None), 1024);
        assert_eq!(connection_cap(1024, Some(1)), 1);
    }

    #[test]
    fn raising_twice_changes_nothing_the_second_time() {
        // The test process may already be at its hard limit; either way the second call
        // finds nothing to raise and the soft limit never exceeds the hard one.
        let first = raise_soft_to_hard().unwrap();
        let (before, after) = raise_soft_to_hard().unwrap();
        assert_eq!(before, after);
        assert_eq!(after, first.1);
        let l = getrlimit(Resource::Nofile);
        assert!(l.maximum.is_none() || l.current <= l.maximum, "{l:?}");
    }
}
