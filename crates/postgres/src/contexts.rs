//! The `code_contexts` table (schema_v16.sql): the code interpreter's contexts of each
//! session. The add locks the session's row (`FOR UPDATE`) before it counts, so concurrent
//! adds on any replicas are counted one after the other and never pass the cap; the table's
//! trigger removes a session's contexts when it ends and marks them lost when it is
//! hibernated.

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt, sql};
use sandboxd_core::store::{CodeContextRow, CodeContexts, ContextAdded, StoreError};

const COLS: &str = "session_id, id, language, cwd, created_at, lost, holder";

fn from_row(r: &tokio_postgres::Row) -> Result<CodeContextRow, StoreError> {
    Ok(CodeContextRow {
        session_id: col(r, 0)?,
        id: col(r, 1)?,
        language: col(r, 2)?,
        cwd: col(r, 3)?,
        created_at: col(r, 4)?,
        lost: col(r, 5)?,
        holder: col(r, 6)?,
    })
}

#[async_trait]
impl CodeContexts for PgStore {
    async fn add_code_context(
        &self,
        row: CodeContextRow,
        cap: u32,
    ) -> Result<ContextAdded, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(sql)?;
        let state = query_opt(
            &tx,
            "SELECT state FROM sessions WHERE id = $1 FOR UPDATE",
            &[&row.session_id],
        )
        .await?;
        let state = state.map(|r| col::<String>(&r, 0)).transpose()?;
        if state.as_deref() != Some("running") {
            return Ok(ContextAdded::NoSession);
        }
        let n = query_opt(
            &tx,
            "SELECT count(*) FROM code_contexts WHERE session_id = $1",
            &[&row.session_id],
        )
        .await?;
        let n = n.map(|r| col::<i64>(&r, 0)).transpose()?.unwrap_or(0);
        if n >= i64::from(cap) {
            return Ok(ContextAdded::Full);
        }
        execute(
            &tx,
            &format!("INSERT INTO code_contexts ({COLS}) VALUES ($1, $2, $3, $4, $5, FALSE, $6)"),
            &[
                &row.session_id,
                &row.id,
                &row.language,
                &row.cwd,
                &row.created_at,
                &row.holder,
            ],
        )
        .await?;
        tx.commit().await.map_err(sql)?;
        Ok(ContextAdded::Added)
    }

    async fn code_contexts(&self, session_id: &str) -> Result<Vec<CodeContextRow>, StoreError> {
        let c = self.client().await?;
        let rows = query(
            &c,
            &format!(
                "SELECT {COLS} FROM code_contexts WHERE session_id = $1 ORDER BY created_at, id"
            ),
            &[&session_id],
        )
        .await?;
        rows.iter().map(from_row).collect()
    }

    async fn code_context(
        &self,
        session_id: &str,
        id: &str,
    ) -> Result<Option<CodeContextRow>, StoreError> {
        let c = self.client().await?;
        let row = query_opt(
            &c,
            &format!("SELECT {COLS} FROM code_contexts WHERE session_id = $1 AND id = $2"),
            &[&session_id, &id],
        )
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    async fn remove_code_context(&self, session_id: &str, id: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "DELETE FROM code_contexts WHERE session_id = $1 AND id = $2",
            &[&session_id, &id],
        )
        .await?;
        Ok(n > 0)
    }

    async fn hold_code_context(
        &self,
        session_id: &str,
        id: &str,
        replica: &str,
    ) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "UPDATE code_contexts SET holder = $3 WHERE session_id = $1 AND id = $2",
            &[&session_id, &id, &replica],
        )
        .await?;
        Ok(n > 0)
    }

    async fn take_code_context_loss(&self, session_id: &str, id: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "UPDATE code_contexts SET lost = FALSE
             WHERE session_id = $1 AND id = $2 AND lost",
            &[&session_id, &id],
        )
        .await?;
        Ok(n > 0)
    }
}
