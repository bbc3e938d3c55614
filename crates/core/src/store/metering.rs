//! Usage metering (issue 28, item 2): what each session used, kept per session and summed
//! per owner and UTC day, for billing and budgets (`GET /v1/usage`, `sandboxd users usage`).
//!
//! Two kinds of measure. The sandbox's cgroup is *sampled* (`meter_sample`): its CPU time is
//! a counter that only grows while its container lives, so the store keeps the last reading
//! and adds the difference; memory is a level, so the store adds `level × time since the last
//! sample` (GiB-seconds), and the time since the last sample is the wall-clock time alive.
//! Everything else is *counted* where it happens (`meter_count`): bytes through the file and
//! archive routes, tokens per model, tool calls. Both go to the session's totals and to its
//! owner's day (the day of the sample or count) in one transaction, so the days always sum to
//! the sessions, and the last reading is in the store: a restart (or another replica taking
//! the sample) goes on from it, never from a process's memory. Two replicas sampling the
//! same session at once are serialized by that transaction: the second adds only what
//! happened since the first.
//!
//! A reading names its container: one of another container than the stored reading's is a
//! new container (a hibernated session resumed), whose CPU counts from zero, and the memory
//! of the gap is not counted (nothing held it). A reading of the same container below the
//! stored one was taken earlier and arrived late (a sampler racing a session's end, or
//! another replica): it adds nothing.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// The longest model name kept (the configured model's; longer ones are cut).
pub const MAX_MODEL_CHARS: usize = 128;
/// The most days back one reader asks for (`GET /v1/usage?days=`).
pub const MAX_USAGE_DAYS: u32 = 400;
/// The most rows (user-days) one `usage_days` answer holds.
pub const MAX_USAGE_ROWS: u32 = 40_000;
/// The most sessions one `usage_sessions` answer holds.
pub const MAX_USAGE_SESSIONS: u32 = 1000;

/// One reading of a sandbox's cgroup; None where the backend cannot tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// The backend's handle of the container read (its counter is that container's).
    pub container: String,
    /// When it was read, unix ms.
    pub at: i64,
    /// CPU time since the container was made, in microseconds (a counter).
    pub cpu_usec: Option<u64>,
    /// Memory in use now, in bytes (a level).
    pub memory_bytes: Option<u64>,
}

/// Amounts counted where they happen, added as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    /// Bytes written into the sandbox through the file and archive routes.
    pub bytes_in: u64,
    /// Bytes read out of the sandbox through them.
    pub bytes_out: u64,
    pub tool_calls: u64,
    /// The model the tokens were spent with (required when tokens are counted).
    pub model: Option<String>,
    pub tokens_in: u64,
    pub tokens_out: u64,
}

impl Counted {
    /// The model name as the store keeps it: cut, NUL replaced.
    pub fn model_bounded(&self) -> Option<String> {
        self.model.as_ref().map(|m| {
            m.chars()
                .take(MAX_MODEL_CHARS)
                .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
                .collect()
        })
    }
}

/// Tokens spent with one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelTokens {
    pub model: String,
    pub tokens_in: u64,
    pub tokens_out: u64,
}

/// What was used, summed (a session's, or an owner's day).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageTotals {
    pub cpu_seconds: f64,
    pub memory_gib_seconds: f64,
    pub wall_seconds: f64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub tool_calls: u64,
    /// Sorted by model.
    pub tokens: Vec<ModelTokens>,
}

/// A session's totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionUsage {
    pub session_id: String,
    /// The owning user's id.
    pub owner: String,
    /// Unix ms of its first measure.
    pub first_at: i64,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// An owner's totals of one UTC day.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DayUsage {
    /// The owning user's id.
    pub owner: String,
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// Which rows a reader wants: one owner's or everyone's, between two times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    /// None: every owner (admins).
    pub owner: Option<String>,
    /// Unix ms; days (and sessions first measured) from the UTC day of `from` on.
    pub from: i64,
    /// Unix ms; up to and including the UTC day of `to`.
    pub to: i64,
    pub limit: u32,
}

/// Memory × time as GiB-seconds: bytes × milliseconds / (2^30 × 1000).
pub fn gib_seconds(bytes: u64, ms: u64) -> f64 {
    (bytes as f64 / (1u64 << 30) as f64) * (ms as f64 / 1000.0)
}

/// What one sample or count adds to a session and its owner's day.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Delta {
    pub cpu_usec: u64,
    pub memory_gib_seconds: f64,
    pub wall_ms: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub tool_calls: u64,
}

impl Counted {
    /// Its amounts other than tokens.
    pub fn delta(&self) -> Delta {
        Delta {
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            tool_calls: self.tool_calls,
            ..Delta::default()
        }
    }
}

impl Reading {
    /// Whether it tells nothing (the backend could not read either measure).
    pub fn is_empty(&self) -> bool {
        self.cpu_usec.is_none() && self.memory_bytes.is_none()
    }
}

/// What one sample adds, given the stored last CPU reading and its container (None before
/// the first sample) and the time of the last sample (before the first: when the session
/// began); None for a late reading of the same container (nothing is added, nothing moves).
pub fn sample_delta(last: Option<(&str, u64)>, since: i64, r: &Reading) -> Option<Delta> {
    let elapsed = r.at.saturating_sub(since).max(0) as u64;
    let (cpu, fresh) = match (r.cpu_usec, last) {
        (None, _) => (0, false),
        (Some(c), Some((container, l))) if container == r.container => {
            if c < l {
                return None;
            }
            (c - l, false)
        }
        (Some(c), Some(_)) => (c, true),
        (Some(c), None) => (c, false),
    };
    let memory = match r.memory_bytes {
        Some(b) if !fresh => gib_seconds(b, elapsed),
        _ => 0.0,
    };
    Some(Delta {
        cpu_usec: cpu,
        memory_gib_seconds: memory,
        wall_ms: elapsed,
        ..Delta::default()
    })
}

/// The store's usage rows. Every method is one short transaction.
#[async_trait]
pub trait Metering: Send + Sync {
    /// Adds a reading of the sandbox whose runtime id is `runtime_id` to its session and
    /// its owner's day of the reading (see the module's header); returns false when no
    /// session row names that runtime id (nothing is written). A reading dated at or before
    /// the last one adds no time.
    async fn meter_sample(&self, runtime_id: &str, reading: &Reading) -> Result<bool, StoreError>;
    /// Adds `counted` to session `session_id` and its owner's day of `now`; false when no
    /// such session row exists (nothing is written).
    async fn meter_count(
        &self,
        session_id: &str,
        counted: &Counted,
        now: i64,
    ) -> Result<bool, StoreError>;
    /// The owner's (or everyone's) days, oldest first, at most `limit` (≤ `MAX_USAGE_ROWS`).
    async fn usage_days(&self, q: &UsageQuery) -> Result<Vec<DayUsage>, StoreError>;
    /// The owner's (or everyone's) sessions first measured in the range, oldest first, at
    /// most `limit` (≤ `MAX_USAGE_SESSIONS`).
    async fn usage_sessions(&self, q: &UsageQuery) -> Result<Vec<SessionUsage>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(container: &str, at: i64, cpu: u64, mem: u64) -> Reading {
        Reading {
            container: container.into(),
            at,
            cpu_usec: Some(cpu),
            memory_bytes: Some(mem),
        }
    }

    #[test]
    fn a_sample_adds_the_counter_difference_and_the_level_times_the_time() {
        let d = sample_delta(
            Some(("c", 1_000_000)),
            10_000,
            &r("c", 12_000, 3_000_000, 1 << 30),
        );
        let d = d.unwrap();
        assert_eq!((d.cpu_usec, d.wall_ms), (2_000_000, 2_000));
        assert!((d.memory_gib_seconds - 2.0).abs() < 1e-9);
        // The first sample counts from the session's start.
        let d = sample_delta(None, 0, &r("c", 1_000, 500, 0)).unwrap();
        assert_eq!((d.cpu_usec, d.wall_ms), (500, 1_000));
    }

    #[test]
    fn a_new_container_counts_from_zero_and_no_memory_for_the_gap() {
        let d = sample_delta(
            Some(("old", 9_000_000)),
            0,
            &r("new", 60_000, 1_000, 1 << 30),
        );
        let d = d.unwrap();
        assert_eq!((d.cpu_usec, d.wall_ms), (1_000, 60_000));
        assert_eq!(d.memory_gib_seconds, 0.0);
        // Even when its counter is already past the old one's.
        let d = sample_delta(Some(("old", 5)), 0, &r("new", 1_000, 9, 1 << 30)).unwrap();
        assert_eq!((d.cpu_usec, d.memory_gib_seconds), (9, 0.0));
    }

    #[test]
    fn a_late_reading_adds_nothing_and_one_without_measures_only_time() {
        assert_eq!(sample_delta(Some(("c", 5)), 0, &r("c", 9_000, 4, 1)), None);
        let none = Reading {
            container: "c".into(),
            at: 2_000,
            ..Reading::default()
        };
        assert!(none.is_empty());
        let d = sample_delta(Some(("c", 5)), 1_000, &none).unwrap();
        assert_eq!(
            (d.cpu_usec, d.memory_gib_seconds, d.wall_ms),
            (0, 0.0, 1_000)
        );
        let before = Reading { at: 500, ..none };
        assert_eq!(
            sample_delta(Some(("c", 5)), 1_000, &before)
                .unwrap()
                .wall_ms,
            0
        );
    }

    #[test]
    fn model_names_are_cut() {
        let c = Counted {
            model: Some(format!("{}\0", "m".repeat(500))),
            ..Counted::default()
        };
        let m = c.model_bounded().unwrap();
        assert_eq!(m.chars().count(), MAX_MODEL_CHARS);
        let c = Counted {
            model: Some("gpt\0x".into()),
            ..Counted::default()
        };
        assert_eq!(c.model_bounded().unwrap(), "gpt\u{FFFD}x");
    }
}
