//! The `code_contexts` table (schema_v17.sql): the code interpreter's contexts of each
//! session. The add counts and inserts in one write transaction (`BEGIN IMMEDIATE`), so the
//! cap holds against every writer; the table's triggers remove a session's contexts when it
//! ends and mark them lost when it is hibernated.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use crate::{SqliteStore, sql};
use sandboxd_core::store::{CodeContextRow, CodeContexts, ContextAdded, StoreError};

const COLS: &str = "session_id, id, language, cwd, created_at, lost, holder";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CodeContextRow> {
    Ok(CodeContextRow {
        session_id: r.get(0)?,
        id: r.get(1)?,
        language: r.get(2)?,
        cwd: r.get(3)?,
        created_at: r.get(4)?,
        lost: r.get::<_, i64>(5)? != 0,
        holder: r.get(6)?,
    })
}

#[async_trait]
impl CodeContexts for SqliteStore {
    async fn add_code_context(
        &self,
        row: CodeContextRow,
        cap: u32,
    ) -> Result<ContextAdded, StoreError> {
        self.write(move |tx| {
            let state: Option<String> = tx
                .query_row(
                    "SELECT state FROM sessions WHERE id = ?1",
                    [&row.session_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?;
            if state.as_deref() != Some("running") {
                return Ok(ContextAdded::NoSession);
            }
            let n: i64 = tx
                .query_row(
                    "SELECT count(*) FROM code_contexts WHERE session_id = ?1",
                    [&row.session_id],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            if n >= i64::from(cap) {
                return Ok(ContextAdded::Full);
            }
            tx.execute(
                &format!("INSERT INTO code_contexts ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6)"),
                params![
                    row.session_id,
                    row.id,
                    row.language,
                    row.cwd,
                    row.created_at,
                    row.holder
                ],
            )
            .map_err(sql)?;
            Ok(ContextAdded::Added)
        })
        .await
    }

    async fn code_contexts(&self, session_id: &str) -> Result<Vec<CodeContextRow>, StoreError> {
        let session_id = session_id.to_string();
        self.read(move |c| {
            let mut st = c
                .prepare_cached(&format!(
                    "SELECT {COLS} FROM code_contexts WHERE session_id = ?1
                     ORDER BY created_at, id"
                ))
                .map_err(sql)?;
            let rows = st.query_map([session_id], from_row).map_err(sql)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql)
        })
        .await
    }

    async fn code_context(
        &self,
        session_id: &str,
        id: &str,
    ) -> Result<Option<CodeContextRow>, StoreError> {
        let (session_id, id) = (session_id.to_string(), id.to_string());
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {COLS} FROM code_contexts WHERE session_id = ?1 AND id = ?2"),
                params![session_id, id],
                from_row,
            )
            .optional()
            .map_err(sql)
        })
        .await
    }

    async fn remove_code_context(&self, session_id: &str, id: &str) -> Result<bool, StoreError> {
        let (session_id, id) = (session_id.to_string(), id.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "DELETE FROM code_contexts WHERE session_id = ?1 AND id = ?2",
                    params![session_id, id],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hold_code_context(
        &self,
        session_id: &str,
        id: &str,
        replica: &str,
    ) -> Result<bool, StoreError> {
        let (session_id, id, replica) =
            (session_id.to_string(), id.to_string(), replica.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE code_contexts SET holder = ?3 WHERE session_id = ?1 AND id = ?2",
                    params![session_id, id, replica],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn take_code_context_loss(&self, session_id: &str, id: &str) -> Result<bool, StoreError> {
        let (session_id, id) = (session_id.to_string(), id.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE code_contexts SET lost = 0
                     WHERE session_id = ?1 AND id = ?2 AND lost = 1",
                    params![session_id, id],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }
}
