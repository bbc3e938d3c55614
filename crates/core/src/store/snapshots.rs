//! Hibernated sessions in the store: a running API session whose /workspace was saved to a
//! snapshot file and whose sandbox was removed. The row stays `running` (so it counts in its
//! owner's session quota and nothing else about it changes) and names its snapshot; the next
//! use on any replica resumes it. Every change is one conditional update, so of replicas
//! racing exactly one wins, and the row changes only once the snapshot is complete
//! (server/src/hibernate.rs writes it before it calls `hibernate_session`).

use async_trait::async_trait;

use super::StoreError;

#[async_trait]
pub trait SessionSnapshots: Send + Sync {
    /// Marks the running, not hibernated session `id` hibernated with the snapshot file
    /// `snapshot`, only if its last use is at most `used_before` and none of its runs is in
    /// flight; returns whether this call did (false: used meanwhile, ended, or already
    /// hibernated by another replica).
    async fn hibernate_session(
        &self,
        id: &str,
        snapshot: &str,
        used_before: i64,
    ) -> Result<bool, StoreError>;

    /// Marks the hibernated session `id` running on `container_id` again, only if it has
    /// not ended and its snapshot is still `snapshot`; its last use is `now`. Returns
    /// whether this call did.
    async fn resume_session(
        &self,
        id: &str,
        snapshot: &str,
        container_id: &str,
        now: i64,
    ) -> Result<bool, StoreError>;

    /// Ends every hibernated session unused for longer than its own idle timeout at `now`
    /// (none of its runs in flight), with `reason`; returns the (id, snapshot) of each one
    /// this call ended, so the caller deletes their snapshot files.
    async fn end_idle_hibernated(
        &self,
        reason: &str,
        now: i64,
    ) -> Result<Vec<(String, String)>, StoreError>;
}
