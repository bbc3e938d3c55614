//! The `audit_log` table (schema_v13.sql): appended to, bounded in the same transaction
//! (entries past the retention and past the row cap go), read a page at a time by `seq`.

use async_trait::async_trait;
use rusqlite::params;

use crate::{SqliteStore, sql, to_json};
use sandboxd_core::store::audit::MAX_AUDIT_PAGE;
use sandboxd_core::store::{Audit, AuditBound, AuditEntry, AuditQuery, NewAudit, StoreError};

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, NewAudit, String)> {
    Ok((
        r.get(0)?,
        NewAudit {
            at: r.get(1)?,
            actor: r.get(2)?,
            action: r.get(3)?,
            target: r.get(4)?,
            request_id: r.get(5)?,
            client: r.get(6)?,
            details: serde_json::Value::Null,
        },
        r.get(7)?,
    ))
}

#[async_trait]
impl Audit for SqliteStore {
    async fn append_audit(&self, entry: &NewAudit, bound: AuditBound) -> Result<i64, StoreError> {
        let e = entry.bounded();
        let details = to_json(&e.details)?;
        let max_rows = i64::try_from(bound.max_rows.max(1)).unwrap_or(i64::MAX);
        self.write(move |tx| {
            let seq: i64 = tx
                .query_row(
                    "INSERT INTO audit_log (at_ms, actor, action, target, request_id, client, details)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING seq",
                    params![e.at, e.actor, e.action, e.target, e.request_id, e.client, details],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            // Two statements, so each is one index range.
            tx.execute("DELETE FROM audit_log WHERE at_ms <= ?1", params![bound.before])
                .map_err(sql)?;
            tx.execute(
                "DELETE FROM audit_log WHERE seq <= ?1",
                params![seq.saturating_sub(max_rows)],
            )
            .map_err(sql)?;
            Ok(seq)
        })
        .await
    }

    async fn audit_page(&self, q: AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let limit = i64::from(q.limit.clamp(1, MAX_AUDIT_PAGE));
        let after = q.after.unwrap_or(i64::MIN);
        let before = q.before.unwrap_or(i64::MAX);
        let order = if q.newest_first { "DESC" } else { "ASC" };
        self.read(move |c| {
            let text = format!(
                "SELECT seq, at_ms, actor, action, target, request_id, client, details
                 FROM audit_log WHERE seq > ?1 AND seq < ?2 ORDER BY seq {order} LIMIT ?3"
            );
            let mut st = c.prepare(&text).map_err(sql)?;
            let rows = st
                .query_map(params![after, before, limit], entry)
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            rows.into_iter()
                .map(|(seq, mut entry, details)| {
                    entry.details =
                        serde_json::from_str(&details).map_err(|e| StoreError::Corrupt {
                            what: "audit entry",
                            message: e.to_string(),
                        })?;
                    Ok(AuditEntry { seq, entry })
                })
                .collect()
        })
        .await
    }
}
