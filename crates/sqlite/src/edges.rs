//! The `auth_failures` and `mcp_sessions` tables (schema_v9.sql): the sign-in throttle's
//! windows and serve's MCP sessions, shared by every process on the store.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use crate::{SqliteStore, sql};
use sandboxd_core::store::{
    AuthFailures, AuthWindow, McpSandbox, McpSessionRow, McpSessions, StoreError,
};

#[async_trait]
impl AuthFailures for SqliteStore {
    async fn auth_failed(
        &self,
        source: &str,
        now: i64,
        window_ms: i64,
        max_sources: u32,
    ) -> Result<AuthWindow, StoreError> {
        let source = source.to_string();
        let ended = now.saturating_sub(window_ms);
        self.write(move |tx| {
            tx.execute(
                "DELETE FROM auth_failures WHERE window_start <= ?1",
                [ended],
            )
            .map_err(sql)?;
            let (start, failures): (i64, i64) = tx
                .query_row(
                    "INSERT INTO auth_failures (source, window_start, failures) VALUES (?1, ?2, 1)
                     ON CONFLICT (source) DO UPDATE SET failures = failures + 1
                     RETURNING window_start, failures",
                    params![source, now],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(sql)?;
            if failures == 1 {
                // A new source: past the bound, the oldest windows make room.
                tx.execute(
                    "DELETE FROM auth_failures WHERE source IN (
                         SELECT source FROM auth_failures WHERE source <> ?1
                         ORDER BY window_start
                         LIMIT max(0, (SELECT count(*) FROM auth_failures) - ?2))",
                    params![source, i64::from(max_sources.max(1))],
                )
                .map_err(sql)?;
            }
            Ok(AuthWindow {
                failures: u32::try_from(failures).unwrap_or(u32::MAX),
                ends_at: start.saturating_add(window_ms),
            })
        })
        .await
    }
}

const MCP_COLS: &str = "id, owner, init, sandbox_row, sandbox_runtime_id, created_at, last_used_at";

fn mcp_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<McpSessionRow> {
    let row: Option<String> = r.get(3)?;
    let runtime_id: Option<String> = r.get(4)?;
    Ok(McpSessionRow {
        id: r.get(0)?,
        owner: r.get(1)?,
        init: r.get(2)?,
        sandbox: row
            .zip(runtime_id)
            .map(|(row, runtime_id)| McpSandbox { row, runtime_id }),
        created_at: r.get(5)?,
        last_used_at: r.get(6)?,
    })
}

#[async_trait]
impl McpSessions for SqliteStore {
    async fn put_mcp_session(&self, row: McpSessionRow) -> Result<(), StoreError> {
        self.write(move |tx| {
            let (sb_row, sb_rt) = row.sandbox.map(|s| (s.row, s.runtime_id)).unzip();
            tx.execute(
                &format!(
                    "INSERT INTO mcp_sessions ({MCP_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (id) DO UPDATE SET init = excluded.init,
                         last_used_at = max(last_used_at, excluded.last_used_at)"
                ),
                params![
                    row.id,
                    row.owner,
                    row.init,
                    sb_row,
                    sb_rt,
                    row.created_at,
                    row.last_used_at
                ],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<McpSessionRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {MCP_COLS} FROM mcp_sessions WHERE id = ?1"),
                [id],
                mcp_from_row,
            )
            .optional()
            .map_err(sql)
        })
        .await
    }

    async fn set_mcp_sandbox(
        &self,
        id: &str,
        sandbox: Option<McpSandbox>,
        now: i64,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            let (sb_row, sb_rt) = sandbox.map(|s| (s.row, s.runtime_id)).unzip();
            tx.execute(
                "UPDATE mcp_sessions SET sandbox_row = ?2, sandbox_runtime_id = ?3,
                     last_used_at = max(last_used_at, ?4) WHERE id = ?1",
                params![id, sb_row, sb_rt, now],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn touch_mcp_session(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            tx.execute(
                "UPDATE mcp_sessions SET last_used_at = ?2 WHERE id = ?1 AND last_used_at < ?2",
                params![id, now],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn remove_mcp_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            let n = tx
                .execute("DELETE FROM mcp_sessions WHERE id = ?1", [id])
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn purge_mcp_sessions(&self, cutoff: i64) -> Result<u64, StoreError> {
        self.write(move |tx| {
            let n = tx
                .execute("DELETE FROM mcp_sessions WHERE last_used_at < ?1", [cutoff])
                .map_err(sql)?;
            Ok(n as u64)
        })
        .await
    }
}
