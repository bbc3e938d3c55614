//! The `tool_records` table (schema_v5.sql): kept sessions' tool records, opaque bytes per
//! (session, kind), bounded by `check_record_size` before anything is written; and the
//! hibernation marks of the `sessions` table (`SessionSnapshots`, statements in sessions.rs),
//! the other half of what a hibernated session keeps.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use crate::{SqliteStore, sql};
use sandboxd_core::store::{SessionSnapshots, StoreError, ToolRecords, check_record_size};

#[async_trait]
impl ToolRecords for SqliteStore {
    async fn record(&self, session_id: &str, kind: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, kind) = (session_id.to_string(), kind.to_string());
        self.read(move |c| {
            c.query_row(
                "SELECT bytes FROM tool_records WHERE session_id = ?1 AND kind = ?2",
                params![id, kind],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql)
        })
        .await
    }

    async fn put_record(
        &self,
        session_id: &str,
        kind: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError> {
        check_record_size(session_id, kind, bytes.len())?;
        let (id, kind) = (session_id.to_string(), kind.to_string());
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO tool_records (session_id, kind, bytes) VALUES (?1, ?2, ?3)
                 ON CONFLICT (session_id, kind) DO UPDATE SET bytes = excluded.bytes",
                params![id, kind, bytes],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn clear_record(&self, session_id: &str, kind: &str) -> Result<bool, StoreError> {
        let (id, kind) = (session_id.to_string(), kind.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "DELETE FROM tool_records WHERE session_id = ?1 AND kind = ?2",
                    params![id, kind],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn forget_records(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let id = session_id.to_string();
        self.write(move |tx| {
            let kinds = {
                let mut q = tx
                    .prepare("SELECT kind FROM tool_records WHERE session_id = ?1 ORDER BY kind")
                    .map_err(sql)?;
                q.query_map([&id], |r| r.get::<_, String>(0))
                    .map_err(sql)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql)?
            };
            tx.execute("DELETE FROM tool_records WHERE session_id = ?1", [&id])
                .map_err(sql)?;
            Ok(kinds)
        })
        .await
    }

    async fn record_sessions(&self) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            let mut q = c
                .prepare("SELECT DISTINCT session_id FROM tool_records ORDER BY session_id")
                .map_err(sql)?;
            q.query_map([], |r| r.get::<_, String>(0))
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)
        })
        .await
    }
}

#[async_trait]
impl SessionSnapshots for SqliteStore {
    async fn hibernate_session(
        &self,
        id: &str,
        snapshot: &str,
        used_before: i64,
    ) -> Result<bool, StoreError> {
        let (id, snapshot) = (id.to_string(), snapshot.to_string());
        self.write(move |tx| crate::sessions::hibernate(tx, &id, &snapshot, used_before))
            .await
    }

    async fn resume_session(
        &self,
        id: &str,
        snapshot: &str,
        container_id: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let (id, snapshot, container) = (
            id.to_string(),
            snapshot.to_string(),
            container_id.to_string(),
        );
        self.write(move |tx| crate::sessions::resume(tx, &id, &snapshot, &container, now))
            .await
    }

    async fn end_idle_hibernated(
        &self,
        reason: &str,
        now: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let reason = reason.to_string();
        self.write(move |tx| crate::sessions::end_idle_hibernated(tx, &reason, now))
            .await
    }
}
