//! The daily CPU quota (`[quotas] cpu_seconds_per_day`, a user's `cpu_seconds_per_day`
//! override; issue 28, item 2): once a user's sandboxes have used that many CPU-seconds in
//! the UTC day, no new work of theirs starts until the next UTC midnight — no session (API,
//! E2B, a run's, an /mcp sandbox), no command (exec, streamed exec, process, E2B's process
//! and code cell), no tool call (`/v1` and /mcp) and no run (`/v1`, A2A) — refused with 429
//! `quota_exceeded` naming the quota, today's figure, the limit and when it resets. What
//! costs no CPU stays open (reading files and runs, killing a process, ending a session), so
//! a user can still fetch their results and stop what burns. A run in flight stops at its
//! next tool call (runs/sink.rs), as the token quota stops one at its next model answer.
//!
//! `admit` (the HTTP front ends) and `spent` (also /mcp's admission, and the run's sink) are
//! the one composition of the check; every entry of new work calls one of them, once per
//! request (`Admitted` is the proof a caller passes on, so `sessions::create` under a run
//! does not check again). The quota and the figure are those of whoever the CPU is metered
//! to: the session's owner for work in an existing session (`admit_owner`; an admin acting
//! in a user's session is held to that user's quota, not their own), the caller for a new
//! session.
//!
//! When the figure cannot be read (the store is down), new work is refused: 503
//! `store_unavailable` over HTTP, the same words as the tool's error over /mcp. A run in
//! flight carries on (its sink logs a warning): stopping it would lose its work for a blip
//! of the store, and its next tool call checks again. Not gated, since they start no CPU
//! work by themselves: resuming a hibernated session, E2B's connect, and restarting a code
//! context (the commands and cells that follow are).
//!
//! The figure is the store's, never a process's: usage metering's day sum of the user
//! (`Metering::usage_days`), to which whichever replica holds a sandbox adds its cgroup
//! samples (metering.rs), so every replica decides alike. It lacks what the sandboxes used
//! since their last sample: knowing that would take a cgroup read of every sandbox of the
//! user, some held by other replicas, on every request. So it is stale by at most
//! `[sessions] usage_sample_secs` (60 by default, plus one sampling pass), and a user may go
//! past the quota by what their sandboxes burn in that time; with `usage_sample_secs = 0`
//! only a session's last reading (at its end) counts.

use sandboxd_core::config::Config;
use sandboxd_core::store::{Store, StoreError, UsageQuery, now_ms};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode, STORE_RETRY_SECS};
use crate::quota::Quota;

/// The quota's name in errors and run outcomes.
pub const QUOTA: &str = "cpu_seconds_per_day";

const DAY_MS: i64 = 86_400_000;

/// The quota is spent: today's figure, the limit, and when it was found (for the reset).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuSpent {
    pub used: f64,
    pub limit: u64,
    pub now: i64,
}

impl CpuSpent {
    /// Unix ms of the next UTC midnight, when the day's count starts again.
    pub fn resets_at(&self) -> i64 {
        (self.now.div_euclid(DAY_MS) + 1) * DAY_MS
    }

    /// Whole seconds until then (at least 1).
    pub fn resets_in_secs(&self) -> u64 {
        let ms = (self.resets_at() - self.now).max(1) as u64;
        ms.div_ceil(1000)
    }

    /// What the client is told: the quota, the figure, the limit, the reset, what to do.
    pub fn message(&self) -> String {
        let at = chrono::DateTime::from_timestamp_millis(self.resets_at())
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        let secs = self.resets_in_secs();
        format!(
            "your daily CPU quota ({QUOTA}) is spent: your sandboxes used {:.1} of your {} CPU-seconds of today (UTC), so no new session, command, tool call or run starts; it resets at 00:00 UTC ({at}, in {}h {:02}m); wait for then, or ask the admin to raise the quota",
            self.used,
            self.limit,
            secs / 3600,
            (secs % 3600) / 60
        )
    }
}

impl From<CpuSpent> for ApiError {
    fn from(s: CpuSpent) -> Self {
        let mut e = ApiError::quota(QUOTA, s.limit, s.message());
        e.retry_after = Some(s.resets_in_secs());
        e
    }
}

/// The CPU-seconds `owner`'s sandboxes used in the UTC day of `now`, as the store has them.
pub async fn cpu_seconds_today(
    store: &dyn Store,
    owner: &str,
    now: i64,
) -> Result<f64, StoreError> {
    let q = UsageQuery {
        owner: Some(owner.to_string()),
        from: now,
        to: now,
        limit: 1,
    };
    let days = store.usage_days(&q).await?;
    Ok(days.first().map_or(0.0, |d| d.totals.cpu_seconds))
}

/// Whether `owner`'s daily CPU quota of `limit` seconds (0: none, and nothing is read) is
/// spent now.
pub async fn spent(
    store: &dyn Store,
    limit: u64,
    owner: &str,
) -> Result<Option<CpuSpent>, StoreError> {
    if limit == 0 {
        return Ok(None);
    }
    let now = now_ms();
    let used = cpu_seconds_today(store, owner, now).await?;
    Ok((used >= limit as f64).then_some(CpuSpent { used, limit, now }))
}

/// The user's daily CPU limit in force (their override, else `[quotas]`).
pub fn limit_of(config: &Config, quota: &sandboxd_core::store::QuotaOverride) -> u64 {
    Quota::resolve(&config.quotas, quota, &config.limits).cpu_seconds_per_day
}

/// Proof that a request's work passed the CPU check, so a step further down (the session a
/// run makes) does not check again, and whose quota it was (a run checks it again at each
/// tool call). Only `admit` and `admit_owner` make one.
#[derive(Debug)]
pub struct Admitted {
    owner: String,
    limit: u64,
}

impl Admitted {
    /// The user the CPU is metered to (the session's owner).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Their daily CPU limit in force; 0 is none.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// Refuses new work of the caller in a session of their own, or a new session (429
/// `quota_exceeded`), once their CPU quota of today is spent; 503 when the figure cannot be
/// read.
pub async fn admit(st: &AppState, caller: &Caller) -> Result<Admitted, ApiError> {
    let limit = limit_of(&st.config, &caller.user.quota);
    check(st, limit, caller.id()).await
}

/// Refuses new work in a session of `owner` (its row's owner) once that user's CPU quota of
/// today is spent: the CPU is metered to them, whoever asks (an admin may act in any
/// session). Their quota override is read from the store when they are not the caller.
pub async fn admit_owner(
    st: &AppState,
    caller: &Caller,
    owner: &str,
) -> Result<Admitted, ApiError> {
    if owner == caller.id() {
        return admit(st, caller).await;
    }
    // Only an admin gets here (`owned_row`). The owner's override is read even when no
    // default applies: `sandboxd users quota` may give them one. A removed owner has none:
    // the defaults hold.
    let quota = st
        .store
        .user_by_id(owner)
        .await
        .map_err(unreadable)?
        .map(|u| u.quota)
        .unwrap_or_default();
    check(st, limit_of(&st.config, &quota), owner).await
}

async fn check(st: &AppState, limit: u64, owner: &str) -> Result<Admitted, ApiError> {
    match spent(st.store.as_ref(), limit, owner).await {
        Ok(Some(s)) => Err(s.into()),
        Ok(None) => Ok(Admitted {
            owner: owner.to_string(),
            limit,
        }),
        Err(e) => Err(unreadable(e)),
    }
}

/// The figure (or the owner's quota) cannot be read: new work is refused, as it cannot be
/// told apart from work past the quota (503, retry shortly).
fn unreadable(e: StoreError) -> ApiError {
    tracing::warn!(error = %e, "cannot read a user's CPU-seconds of today; refusing new work");
    let mut err = ApiError::new(
        ErrorCode::StoreUnavailable,
        format!(
            "{} ({e}); retry in {STORE_RETRY_SECS} s",
            unreadable_message()
        ),
    );
    err.retry_after = Some(STORE_RETRY_SECS);
    err
}

/// Why new work is refused when the store cannot say today's figure (HTTP and /mcp alike).
pub fn unreadable_message() -> &'static str {
    "sandboxd could not read your CPU-seconds of today from its store, which your daily CPU quota (cpu_seconds_per_day) is checked against, so no new work starts"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_quota_the_figure_the_limit_and_the_reset() {
        // 2026-12-04T22:30:00Z.
        let now = 1_796_423_400_000;
        let s = CpuSpent {
            used: 1.26,
            limit: 1,
            now,
        };
        assert_eq!(s.resets_at(), 1_796_428_800_000, "the next UTC midnight");
        assert_eq!(s.resets_in_secs(), 5400);
        let m = s.message();
        for part in [
            QUOTA,
            "used 1.3 of your 1 CPU-seconds",
            "2026-12-05T00:00:00Z",
            "1h 30m",
        ] {
            assert!(m.contains(part), "{part:?} in {m}");
        }
        let e = ApiError::from(s);
        assert_eq!(e.code(), crate::error::ErrorCode::QuotaExceeded);
        assert_eq!(e.code().status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.detail.quota.as_deref(), Some(QUOTA));
        assert_eq!(e.detail.limit.as_deref(), Some("1"));
        assert_eq!(e.retry_after, Some(5400));
        // At midnight exactly the day is new: a whole day to wait.
        let midnight = CpuSpent {
            used: 2.0,
            limit: 1,
            now: 1_796_428_800_000,
        };
        assert_eq!(midnight.resets_in_secs(), 86_400);
    }
}
