//! The `auth_failures` and `mcp_sessions` tables (schema_v6.sql): the sign-in throttle's
//! windows and serve's MCP sessions, shared by every replica.
//!
//! A failure's count is one `INSERT … ON CONFLICT DO UPDATE`, atomic per source row, so
//! concurrent failures on any replicas each get a distinct count. The purges lock only rows
//! nobody else holds (`SKIP LOCKED`): two replicas purging at once never wait on each other
//! or deadlock, and a window one of them skipped is restarted by the upsert itself.

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt};
use sandboxd_core::store::{
    AuthFailures, AuthWindow, McpSandbox, McpSessionRow, McpSessions, StoreError,
};

#[async_trait]
impl AuthFailures for PgStore {
    async fn auth_failed(
        &self,
        source: &str,
        now: i64,
        window_ms: i64,
        max_sources: u32,
    ) -> Result<AuthWindow, StoreError> {
        let c = self.client().await?;
        let ended = now.saturating_sub(window_ms);
        execute(
            &c,
            "DELETE FROM auth_failures WHERE source IN (
                 SELECT source FROM auth_failures WHERE window_start <= $1
                 FOR UPDATE SKIP LOCKED)",
            &[&ended],
        )
        .await?;
        let rows = query(
            &c,
            "INSERT INTO auth_failures AS a (source, window_start, failures) VALUES ($1, $2, 1)
             ON CONFLICT (source) DO UPDATE SET
                 window_start = CASE WHEN a.window_start <= $3 THEN $2 ELSE a.window_start END,
                 failures = CASE WHEN a.window_start <= $3 THEN 1 ELSE a.failures + 1 END
             RETURNING window_start, failures",
            &[&source, &now, &ended],
        )
        .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Sql("the failure count returned no row".into()))?;
        let (start, failures): (i64, i64) = (col(row, 0)?, col(row, 1)?);
        if failures == 1 {
            // A new window: past the bound, the oldest windows make room.
            execute(
                &c,
                "DELETE FROM auth_failures WHERE source IN (
                     SELECT source FROM auth_failures WHERE source <> $1
                     ORDER BY window_start
                     LIMIT greatest(0, (SELECT count(*) FROM auth_failures) - $2)
                     FOR UPDATE SKIP LOCKED)",
                &[&source, &i64::from(max_sources.max(1))],
            )
            .await?;
        }
        Ok(AuthWindow {
            failures: u32::try_from(failures).unwrap_or(u32::MAX),
            ends_at: start.saturating_add(window_ms),
        })
    }
}

const MCP_COLS: &str = "id, owner, init, sandbox_row, sandbox_runtime_id, created_at, last_used_at";

fn mcp_from_row(r: &tokio_postgres::Row) -> Result<McpSessionRow, StoreError> {
    let row: Option<String> = col(r, 3)?;
    let runtime_id: Option<String> = col(r, 4)?;
    Ok(McpSessionRow {
        id: col(r, 0)?,
        owner: col(r, 1)?,
        init: col(r, 2)?,
        sandbox: row
            .zip(runtime_id)
            .map(|(row, runtime_id)| McpSandbox { row, runtime_id }),
        created_at: col(r, 5)?,
        last_used_at: col(r, 6)?,
    })
}

#[async_trait]
impl McpSessions for PgStore {
    async fn put_mcp_session(&self, row: McpSessionRow) -> Result<(), StoreError> {
        let c = self.client().await?;
        let (sb_row, sb_rt) = row.sandbox.map(|s| (s.row, s.runtime_id)).unzip();
        let statement = format!(
            "INSERT INTO mcp_sessions AS m ({MCP_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET init = excluded.init,
                 last_used_at = greatest(m.last_used_at, excluded.last_used_at)"
        );
        execute(
            &c,
            &statement,
            &[
                &row.id,
                &row.owner,
                &row.init,
                &sb_row,
                &sb_rt,
                &row.created_at,
                &row.last_used_at,
            ],
        )
        .await?;
        Ok(())
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<McpSessionRow>, StoreError> {
        let c = self.client().await?;
        let statement = format!("SELECT {MCP_COLS} FROM mcp_sessions WHERE id = $1");
        query_opt(&c, &statement, &[&id])
            .await?
            .map(|r| mcp_from_row(&r))
            .transpose()
    }

    async fn set_mcp_sandbox(
        &self,
        id: &str,
        sandbox: Option<McpSandbox>,
        now: i64,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        let (sb_row, sb_rt) = sandbox.map(|s| (s.row, s.runtime_id)).unzip();
        execute(
            &c,
            "UPDATE mcp_sessions SET sandbox_row = $2, sandbox_runtime_id = $3,
                 last_used_at = greatest(last_used_at, $4) WHERE id = $1",
            &[&id, &sb_row, &sb_rt, &now],
        )
        .await?;
        Ok(())
    }

    async fn touch_mcp_session(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let c = self.client().await?;
        execute(
            &c,
            "UPDATE mcp_sessions SET last_used_at = $2 WHERE id = $1 AND last_used_at < $2",
            &[&id, &now],
        )
        .await?;
        Ok(())
    }

    async fn remove_mcp_session(&self, id: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        Ok(execute(&c, "DELETE FROM mcp_sessions WHERE id = $1", &[&id]).await? > 0)
    }

    async fn purge_mcp_sessions(&self, cutoff: i64) -> Result<u64, StoreError> {
        let c = self.client().await?;
        execute(
            &c,
            "DELETE FROM mcp_sessions WHERE last_used_at < $1",
            &[&cutoff],
        )
        .await
    }
}
