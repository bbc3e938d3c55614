//! The memory budget (`[sessions] memory_budget_mb`): the memory this process's sandboxes,
//! live sessions and warm ones, may use together, as the backend measures it. Measured, not
//! the sum of limits: an idle session uses a few MiB of its 1 GiB limit, and density is the
//! point. Over the budget, warm sandboxes go first (they hold nobody's work), then the
//! longest-idle sessions that have been idle for at least one reap interval; the pool fills
//! only as far as the budget leaves room for sandboxes of the average measured size.

use std::sync::Arc;
use std::time::Duration;

use super::Viewer;
use super::ends::EndReason;
use super::manager::{Session, SessionManager, lock};

/// What the budget check measured.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    /// Bytes in use by every sandbox that answered.
    pub total: u64,
    /// How many sandboxes answered.
    pub counted: usize,
}

impl SessionManager {
    fn budget_bytes(&self) -> u64 {
        self.config.memory_budget_mb.saturating_mul(1 << 20)
    }

    /// Memory in use now by this process's sandboxes; None without a budget (nothing is
    /// measured then) or when the backend cannot tell.
    pub(super) async fn usage(&self) -> Option<Usage> {
        if self.budget_bytes() == 0 {
            return None;
        }
        let handles: Vec<String> = {
            let t = lock(&self.table);
            t.sessions
                .values()
                .map(|s| s.handle.clone())
                .chain(t.pool.iter().map(|w| w.handle.clone()))
                .collect()
        };
        let measured =
            futures::future::join_all(handles.iter().map(|h| self.runtime.memory_usage(h))).await;
        let mut usage = Usage::default();
        for m in measured.into_iter().flatten().flatten() {
            usage.total += m;
            usage.counted += 1;
        }
        (usage.counted > 0).then_some(usage)
    }

    /// How many more sandboxes of the average measured size fit in the budget (unbounded
    /// without a budget or a measurement).
    pub(super) async fn budget_room(&self) -> usize {
        let budget = self.budget_bytes();
        match self.usage().await {
            None => usize::MAX,
            Some(u) => {
                let each = (u.total / u.counted as u64).max(1);
                (budget.saturating_sub(u.total) / each) as usize
            }
        }
    }

    /// Brings the measured use back under the budget: warm sandboxes first, then the
    /// longest-idle sessions (idle at least one reap interval). Returns the removed
    /// session ids (warm ones included).
    pub async fn enforce_memory_budget(&self) -> Vec<String> {
        let budget = self.budget_bytes();
        let Some(usage) = self.usage().await else {
            return Vec::new();
        };
        if usage.total <= budget {
            return Vec::new();
        }
        let mut over = usage.total - budget;
        let each = usage.total / usage.counted as u64;
        let mut removed = Vec::new();
        // Warm sandboxes hold nobody's work: oldest first, each counted at the average.
        while over > 0 {
            let Some(warm) = lock(&self.table).pool.pop_front() else {
                break;
            };
            tracing::info!(session = %warm.session_id, "memory budget: removing a warm sandbox");
            if let Err(e) = self.runtime.remove(&warm.handle).await {
                tracing::warn!(error = %e, "could not remove a warm sandbox");
            }
            over = over.saturating_sub(each);
            removed.push(warm.session_id);
        }
        let min_idle = Duration::from_secs(self.config.reap_interval_secs.max(1));
        let mut idle: Vec<Arc<Session>> = lock(&self.table)
            .sessions
            .values()
            .filter(|s| s.idle_for() >= min_idle && !s.keep)
            .cloned()
            .collect();
        idle.sort_by_key(|s| std::cmp::Reverse(s.idle_for()));
        for s in idle {
            if over == 0 {
                break;
            }
            let used = self
                .runtime
                .memory_usage(&s.handle)
                .await
                .ok()
                .flatten()
                .unwrap_or(each);
            tracing::info!(session = %s.id, "memory budget: removing the longest-idle session");
            let owner = Viewer::Owner(s.owner.clone());
            match self.remove_as(&owner, &s.id, EndReason::MemoryBudget).await {
                Ok(()) => {
                    over = over.saturating_sub(used);
                    removed.push(s.id.clone());
                }
                Err(e) => tracing::warn!(session = %s.id, error = %e, "could not remove"),
            }
        }
        removed
    }
}
