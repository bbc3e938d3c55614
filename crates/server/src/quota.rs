//! How one user's quota in force is worked out: the `[quotas]` defaults, then the user's
//! overrides from the store, capped by the admin's `[limits]`.

use sandboxd_core::config::{LimitRequest, Limits, QuotasConfig};
use sandboxd_core::store::QuotaOverride;

/// One user's quota in force: defaults, then their overrides, capped by the admin's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    pub sessions: u32,
    pub runs: u32,
    pub input_tokens_per_day: u64,
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
}
