//! The `Store` trait on PostgreSQL: each method takes a pooled connection and calls its
//! area's statements (users.rs, sessions.rs, runs.rs, events.rs, usage.rs); the ones of more
//! than one statement, and the capped inserts, run in one transaction (`in_tx!`).

use async_trait::async_trait;

use crate::{PgStore, events, runs, sessions, sql, usage, users};
use sandboxd_core::store::{
    Appended, NewUser, QuotaOverride, RunPage, RunPatch, RunQuery, RunRow, SessionCaps,
    SessionPage, SessionQuery, SessionRow, Store, StoreError, StoredEvent, StoredKey, Usage, User,
    control_wake, now_ms,
};

/// Runs `$body` (which uses the transaction `$tx`) in one transaction on a pooled connection
/// and commits when it succeeds; an error returns early, and the dropped transaction rolls back.
macro_rules! in_tx {
    ($store:ident, |$tx:ident| $body:expr) => {{
        let mut client = $store.client().await?;
        let $tx = client.transaction().await.map_err(sql)?;
        let r = $body;
        $tx.commit().await.map_err(sql)?;
        Ok(r)
    }};
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        let c = self.client().await?;
        crate::execute(
            &c,
            "INSERT INTO meta (key, value) VALUES ('last_ping', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&now_ms().to_string()],
        )
        .await?;
        Ok(())
    }

    async fn add_user(&self, user: NewUser) -> Result<User, StoreError> {
        // No `_`: the id becomes part of a session owner, which allows only letters, digits, `._@:-`.
        let id = format!("usr-{}", uuid::Uuid::new_v4().simple());
        let c = self.client().await?;
        users::insert(&c, &id, user, now_ms()).await?;
        users::one(&c, "WHERE u.id = $1", &[&id])
            .await?
            .ok_or_else(|| StoreError::Sql(format!("user {id} vanished after insert")))
    }

    async fn user_by_key(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        users::one(&c, "WHERE u.key_hash = $1", &[&hash.as_slice()]).await
    }

    async fn user_by_name(&self, name: &str) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        users::one(&c, "WHERE u.name = $1", &[&name]).await
    }

    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        let c = self.client().await?;
        users::one(&c, "WHERE u.id = $1", &[&id]).await
    }

    async fn users(&self) -> Result<Vec<User>, StoreError> {
        let c = self.client().await?;
        users::select(&c, "ORDER BY u.name", &[]).await
    }

    async fn user_count(&self) -> Result<u64, StoreError> {
        users::count(&self.client().await?).await
    }

    async fn remove_user(&self, name: &str, now: i64) -> Result<bool, StoreError> {
        in_tx!(self, |tx| users::remove(&tx, name, now).await?)
    }

    async fn replace_key(&self, name: &str, key: StoredKey) -> Result<bool, StoreError> {
        users::replace_key(&self.client().await?, name, key).await
    }

    async fn set_quota(&self, name: &str, quota: QuotaOverride) -> Result<bool, StoreError> {
        users::set_quota(&self.client().await?, name, &quota).await
    }

    async fn set_admin(&self, name: &str, admin: bool) -> Result<bool, StoreError> {
        let n = crate::execute(
            &self.client().await?,
            "UPDATE users SET admin = $2 WHERE name = $1",
            &[&name, &admin],
        )
        .await?;
        Ok(n > 0)
    }

    async fn touch_user(&self, id: &str, now: i64) -> Result<(), StoreError> {
        users::touch(&self.client().await?, id, now).await
    }

    async fn reserve_session_within(
        &self,
        row: SessionRow,
        caps: SessionCaps,
    ) -> Result<(), StoreError> {
        in_tx!(self, |tx| sessions::reserve(&tx, &row, &caps).await?)
    }

    async fn end_idle_session(
        &self,
        runtime_id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        sessions::end_idle(&self.client().await?, runtime_id, reason, now).await
    }

    async fn add_session_holder(
        &self,
        session_id: &str,
        replica_id: &str,
    ) -> Result<(), StoreError> {
        sessions::add_holder(&self.client().await?, session_id, replica_id).await
    }

    async fn remove_session_holders(
        &self,
        session_id: &str,
        replica_ids: &[String],
    ) -> Result<(), StoreError> {
        sessions::remove_holders(&self.client().await?, session_id, replica_ids).await
    }

    async fn session_holders(&self) -> Result<Vec<(String, String)>, StoreError> {
        sessions::holders(&self.client().await?).await
    }

    async fn session_started(
        &self,
        id: &str,
        runtime_id: &str,
        container_id: &str,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        sessions::started(&c, id, runtime_id, container_id).await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        sessions::one(&self.client().await?, id).await
    }

    async fn list_sessions(&self, q: &SessionQuery) -> Result<SessionPage, StoreError> {
        sessions::list(&self.client().await?, q).await
    }

    async fn active_sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        sessions::active(&self.client().await?).await
    }

    async fn touch_session(&self, id: &str, now: i64) -> Result<(), StoreError> {
        sessions::touch(&self.client().await?, id, now).await
    }

    async fn set_idle_timeout(&self, id: &str, secs: u64, now: i64) -> Result<bool, StoreError> {
        sessions::set_idle_timeout(&self.client().await?, id, secs, now).await
    }

    async fn end_session(&self, id: &str, reason: &str, now: i64) -> Result<bool, StoreError> {
        sessions::end(&self.client().await?, id, reason, now).await
    }

    async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        sessions::delete(&self.client().await?, id).await
    }

    async fn owner_ids(&self) -> Result<Vec<String>, StoreError> {
        sessions::owner_ids(&self.client().await?).await
    }

    async fn usage(&self, owner: &str, now: i64) -> Result<Usage, StoreError> {
        usage::usage(&self.client().await?, owner, now).await
    }

    async fn purge_before(&self, cutoff: i64) -> Result<u64, StoreError> {
        in_tx!(self, |tx| usage::purge_before(&tx, cutoff).await?)
    }

    async fn insert_run(&self, row: RunRow, max_active: u32) -> Result<(), StoreError> {
        in_tx!(self, |tx| runs::insert(&tx, &row, max_active).await?)
    }

    async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        runs::one(&self.client().await?, id).await
    }

    async fn list_runs(&self, q: &RunQuery) -> Result<RunPage, StoreError> {
        runs::list(&self.client().await?, q).await
    }

    async fn runs_in_flight(&self) -> Result<Vec<RunRow>, StoreError> {
        runs::in_flight(&self.client().await?).await
    }

    async fn patch_run(&self, id: &str, patch: RunPatch) -> Result<(), StoreError> {
        runs::patch(&self.client().await?, id, &patch).await
    }

    async fn append_event(
        &self,
        run_id: &str,
        driver: &str,
        event: StoredEvent,
        patch: RunPatch,
    ) -> Result<Appended, StoreError> {
        // One statement, its own transaction: the wake-up is in it, heard only once the
        // event is there to read.
        events::append(&self.client().await?, run_id, driver, &event, &patch).await
    }

    fn run_wakes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.wakes.subscribe()
    }

    async fn wake_run(&self, run_id: &str) -> Result<(), StoreError> {
        PgStore::notify(&self.client().await?, &control_wake(run_id)).await
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        events::after(&self.client().await?, run_id, after, limit).await
    }

    async fn put_image(
        &self,
        run_id: &str,
        id: &str,
        media_type: &str,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        events::put_image(&c, run_id, id, media_type, &data).await
    }

    async fn image(&self, run_id: &str, id: &str) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        events::image(&self.client().await?, run_id, id).await
    }

    async fn conversation(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        events::conversation(&self.client().await?, session_id).await
    }

    async fn set_conversation(
        &self,
        session_id: &str,
        messages: String,
        now: i64,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        events::set_conversation(&c, session_id, &messages, now).await
    }

    async fn add_input_tokens(
        &self,
        owner: &str,
        tokens: u64,
        now: i64,
    ) -> Result<u64, StoreError> {
        events::add_input_tokens(&self.client().await?, owner, tokens, now).await
    }
}
