//! How one user's quota in force is worked out: the `[quotas]` defaults, then the user's
//! overrides from the store, capped by the admin's `[limits]`. (The daily CPU quota's
//! check, which reads the store, is `cpu_quota.rs`.)

use sandboxd_core::config::{LimitRequest, Limits, QuotasConfig};
use sandboxd_core::store::QuotaOverride;

/// One user's quota in force: defaults, then their overrides, capped by the admin's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    pub sessions: u32,
    pub runs: u32,
    pub input_tokens_per_day: u64,
    /// CPU-seconds of the user's sandboxes per UTC day; 0 is no limit.
    pub cpu_seconds_per_day: u64,
    /// The most this user's sessions may ask for (never above the admin's limits).
    pub ceiling: Limits,
}

impl Quota {
    pub fn resolve(defaults: &QuotasConfig, user: &QuotaOverride, admin: &Limits) -> Quota {
        let mut ceiling = admin.clone();
        let cap_u = |v: Option<u64>, d: u64, admin: u64| match v.unwrap_or(d) {
            0 => admin,
            n => n.min(admin),
        };
        ceiling.memory_mb = cap_u(user.memory_mb, defaults.memory_mb, admin.memory_mb);
        ceiling.workspace_mb = cap_u(user.workspace_mb, defaults.workspace_mb, admin.workspace_mb);
        ceiling.tmp_mb = cap_u(user.tmp_mb, defaults.tmp_mb, admin.tmp_mb);
        ceiling.pids = match user.pids.unwrap_or(defaults.pids) {
            n if n <= 0 => admin.pids,
            n => n.min(admin.pids),
        };
        ceiling.cpus = match user.cpus.unwrap_or(defaults.cpus) {
            n if n.is_finite() && n > 0.0 => n.min(admin.cpus),
            _ => admin.cpus,
        };
        Quota {
            sessions: user.sessions.unwrap_or(defaults.sessions),
            runs: user.runs.unwrap_or(defaults.runs),
            input_tokens_per_day: user
                .input_tokens_per_day
                .unwrap_or(defaults.input_tokens_per_day),
            cpu_seconds_per_day: user
                .cpu_seconds_per_day
                .unwrap_or(defaults.cpu_seconds_per_day),
            ceiling,
        }
    }

    /// The first requested limit above this user's ceiling, as (quota name, ceiling value).
    pub fn exceeded_by(&self, req: &LimitRequest) -> Option<(&'static str, String)> {
        let c = &self.ceiling;
        if let Some(v) = req.memory_mb
            && v > c.memory_mb
        {
            return Some(("memory_mb", c.memory_mb.to_string()));
        }
        if let Some(v) = req.cpus
            && v > c.cpus
        {
            return Some(("cpus", c.cpus.to_string()));
        }
        if let Some(v) = req.pids
            && v > c.pids
        {
            return Some(("pids", c.pids.to_string()));
        }
        if let Some(v) = req.workspace_mb
            && v > c.workspace_mb
        {
            return Some(("workspace_mb", c.workspace_mb.to_string()));
        }
        if let Some(v) = req.tmp_mb
            && v > c.tmp_mb
        {
            return Some(("tmp_mb", c.tmp_mb.to_string()));
        }
        None
    }

    /// The request with every unset limit filled from this user's ceiling, so a session
    /// never gets more than the user may have.
    pub fn fill(&self, req: &LimitRequest) -> LimitRequest {
        let c = &self.ceiling;
        LimitRequest {
            memory_mb: Some(req.memory_mb.unwrap_or(c.memory_mb)),
            cpus: Some(req.cpus.unwrap_or(c.cpus)),
            pids: Some(req.pids.unwrap_or(c.pids)),
            workspace_mb: Some(req.workspace_mb.unwrap_or(c.workspace_mb)),
            tmp_mb: Some(req.tmp_mb.unwrap_or(c.tmp_mb)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_never_exceed_the_admins_limits() {
        let admin = Limits::default();
        let defaults = QuotasConfig {
            memory_mb: 512,
            ..Default::default()
        };
        let user = QuotaOverride {
            sessions: Some(1),
            pids: Some(1_000_000),
            ..Default::default()
        };
        let q = Quota::resolve(&defaults, &user, &admin);
        assert_eq!(q.sessions, 1);
        assert_eq!(q.ceiling.memory_mb, 512);
        assert_eq!(
            q.ceiling.pids, admin.pids,
            "an override cannot raise the admin's ceiling"
        );
        assert_eq!(q.ceiling.cpus, admin.cpus);
        let over = LimitRequest {
            memory_mb: Some(513),
            ..Default::default()
        };
        assert_eq!(q.exceeded_by(&over), Some(("memory_mb", "512".into())));
        let filled = q.fill(&LimitRequest::default());
        assert_eq!(filled.memory_mb, Some(512));
        assert!(admin.lowered(&filled).is_ok());
    }

    #[test]
    fn the_daily_cpu_quota_is_the_users_override_else_the_default_and_0_is_none() {
        let admin = Limits::default();
        let defaults = QuotasConfig {
            cpu_seconds_per_day: 3600,
            ..Default::default()
        };
        let q = Quota::resolve(&defaults, &QuotaOverride::default(), &admin);
        assert_eq!(q.cpu_seconds_per_day, 3600, "no override: the default");
        let user = QuotaOverride {
            cpu_seconds_per_day: Some(1),
            ..Default::default()
        };
        let q = Quota::resolve(&defaults, &user, &admin);
        assert_eq!(q.cpu_seconds_per_day, 1, "the override, below the default");
        let user = QuotaOverride {
            cpu_seconds_per_day: Some(0),
            ..Default::default()
        };
        let q = Quota::resolve(&defaults, &user, &admin);
        assert_eq!(q.cpu_seconds_per_day, 0, "an override of 0 lifts the limit");
        let unset = Quota::resolve(&QuotasConfig::default(), &QuotaOverride::default(), &admin);
        assert_eq!(unset.cpu_seconds_per_day, 0, "no limit unless configured");
        // A later override replaces it; one that does not name it keeps it.
        let merged = QuotaOverride {
            cpu_seconds_per_day: Some(5),
            ..Default::default()
        }
        .merged(&QuotaOverride {
            runs: Some(1),
            ..Default::default()
        });
        assert_eq!(merged.cpu_seconds_per_day, Some(5));
        // A later override that names it wins (0 too: it lifts the limit).
        for later in [9, 0] {
            let merged = merged.merged(&QuotaOverride {
                cpu_seconds_per_day: Some(later),
                ..Default::default()
            });
            assert_eq!(
                merged.cpu_seconds_per_day,
                Some(later),
                "a later {later} wins"
            );
            assert_eq!(merged.runs, Some(1), "and the rest is kept");
        }
    }

    #[test]
    fn an_unset_cpu_override_is_left_out_of_the_stored_json() {
        let json = serde_json::to_string(&QuotaOverride::default()).unwrap();
        assert!(!json.contains("cpu_seconds_per_day"), "{json}");
        let set = QuotaOverride {
            cpu_seconds_per_day: Some(7),
            ..Default::default()
        };
        let json = serde_json::to_string(&set).unwrap();
        let back: QuotaOverride = serde_json::from_str(&json).unwrap();
        assert_eq!(back, set);
        // A row written before the field existed still reads.
        let old: QuotaOverride = serde_json::from_str(r#"{"runs": 2}"#).unwrap();
        assert_eq!(old.cpu_seconds_per_day, None);
    }
}
