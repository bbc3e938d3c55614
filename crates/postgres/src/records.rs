//! The `tool_records` table (schema_v2.sql): kept sessions' tool records, opaque bytes per
//! (session, kind), bounded by `check_record_size` before anything is written. Each method
//! is one statement, so each is its own transaction. Also the hibernation marks of the
//! `sessions` table (`SessionSnapshots`, statements in sessions.rs).

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt};
use sandboxd_core::store::{SessionSnapshots, StoreError, ToolRecords, check_record_size};

#[async_trait]
impl ToolRecords for PgStore {
    async fn record(&self, session_id: &str, kind: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let c = self.client().await?;
        let row = query_opt(
            &c,
            "SELECT bytes FROM tool_records WHERE session_id = $1 AND kind = $2",
            &[&session_id, &kind],
        )
        .await?;
        row.map(|r| col(&r, 0)).transpose()
    }

    async fn put_record(
        &self,
        session_id: &str,
        kind: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError> {
        check_record_size(session_id, kind, bytes.len())?;
        let c = self.client().await?;
        execute(
            &c,
            "INSERT INTO tool_records (session_id, kind, bytes) VALUES ($1, $2, $3)
             ON CONFLICT (session_id, kind) DO UPDATE SET bytes = excluded.bytes",
            &[&session_id, &kind, &bytes],
        )
        .await?;
        Ok(())
    }

    async fn clear_record(&self, session_id: &str, kind: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "DELETE FROM tool_records WHERE session_id = $1 AND kind = $2",
            &[&session_id, &kind],
        )
        .await?;
        Ok(n > 0)
    }

    async fn forget_records(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let c = self.client().await?;
        let rows = query(
            &c,
            "DELETE FROM tool_records WHERE session_id = $1 RETURNING kind",
            &[&session_id],
        )
        .await?;
        let mut kinds = rows
            .iter()
            .map(|r| col::<String>(r, 0))
            .collect::<Result<Vec<_>, _>>()?;
        kinds.sort();
        Ok(kinds)
    }

    async fn record_sessions(&self) -> Result<Vec<String>, StoreError> {
        let c = self.client().await?;
        let rows = query(&c, "SELECT DISTINCT session_id FROM tool_records", &[]).await?;
        // Sorted here, byte-wise like every store: the database's collation may differ.
        let mut ids = rows
            .iter()
            .map(|r| col::<String>(r, 0))
            .collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        Ok(ids)
    }
}

#[async_trait]
impl SessionSnapshots for PgStore {
    async fn hibernate_session(
        &self,
        id: &str,
        snapshot: &str,
        used_before: i64,
    ) -> Result<bool, StoreError> {
        crate::sessions::hibernate(&self.client().await?, id, snapshot, used_before).await
    }

    async fn resume_session(
        &self,
        id: &str,
        snapshot: &str,
        container_id: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        crate::sessions::resume(&self.client().await?, id, snapshot, container_id, now).await
    }

    async fn end_idle_hibernated(
        &self,
        reason: &str,
        now: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        crate::sessions::end_idle_hibernated(&self.client().await?, reason, now).await
    }
}
