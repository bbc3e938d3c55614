//! This host's processes as sandbox creators: the `sandboxd.creator` value a backend on
//! this machine records (pid and kernel start time) and the check that its process lives.
//!
//! The start time makes the check immune to pid reuse: a new process that happens to get
//! a dead creator's pid has a different start time. Backends whose creators run elsewhere
//! (a controller in a cluster) record and check something else.

/// This process's identity: `pid:starttime`.
pub fn creator_label() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", process_start_time(pid).unwrap_or(0))
}

/// Whether the process a `creator_label` names still runs (false for a malformed label).
pub fn creator_alive(label: &str) -> bool {
    parse_creator(label).is_some_and(|(pid, start)| process_start_time(pid) == Some(start))
}

/// The pid a creator label names, for listings.
pub fn creator_pid(label: &str) -> Option<u32> {
    parse_creator(label).map(|(pid, _)| pid)
}

fn parse_creator(label: &str) -> Option<(u32, u64)> {
    let (pid, start) = label.split_once(':')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime) counted after the ")" that closes the command name.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_stale_label_is_not() {
        let me = creator_label();
        assert!(creator_alive(&me), "{me}");
        assert_eq!(creator_pid(&me), Some(std::process::id()));
        let (pid, start) = me.split_once(':').unwrap();
        let reused = format!("{pid}:{}", start.parse::<u64>().unwrap() + 1);
        assert!(!creator_alive(&reused), "a reused pid must not count");
        assert!(!creator_alive("garbage"));
        assert!(!creator_alive("4194304999:1"));
    }
}
