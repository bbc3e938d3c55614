//! The `audit_log` table (schema_v12.sql): an append and its bound in one statement
//! (data-modifying CTEs: the insert, then the entries past the retention and past the row
//! cap deleted), pages by `seq`. Sequence numbers come from a BIGSERIAL, so two replicas'
//! appends may commit out of `seq` order; a reader that pages while they commit may see the
//! later one first (the log is for reading after the fact, not a queue).

use async_trait::async_trait;

use crate::{PgStore, col, query, query_opt, sql, to_json};
use sandboxd_core::store::audit::MAX_AUDIT_PAGE;
use sandboxd_core::store::{Audit, AuditBound, AuditEntry, AuditQuery, NewAudit, StoreError};

#[async_trait]
impl Audit for PgStore {
    async fn append_audit(&self, entry: &NewAudit, bound: AuditBound) -> Result<i64, StoreError> {
        let e = entry.bounded();
        let details = to_json(&e.details)?;
        let max_rows = i64::try_from(bound.max_rows.max(1)).unwrap_or(i64::MAX);
        let c = self.client().await?;
        let row = query_opt(
            &c,
            "WITH ins AS (
                 INSERT INTO audit_log (at_ms, actor, action, target, request_id, client, details)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING seq),
             old AS (
                 DELETE FROM audit_log WHERE at_ms <= $8 RETURNING seq),
             over AS (
                 DELETE FROM audit_log WHERE seq <= (SELECT seq FROM ins) - $9 RETURNING seq)
             SELECT seq FROM ins",
            &[
                &e.at,
                &e.actor,
                &e.action,
                &e.target,
                &e.request_id,
                &e.client,
                &details,
                &bound.before,
                &max_rows,
            ],
        )
        .await?;
        match row {
            Some(r) => col(&r, 0),
            None => Err(sql(std::io::Error::other(
                "the audit insert returned no row",
            ))),
        }
    }

    async fn audit_page(&self, q: AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let limit = i64::from(q.limit.clamp(1, MAX_AUDIT_PAGE));
        let after = q.after.unwrap_or(i64::MIN);
        let before = q.before.unwrap_or(i64::MAX);
        let c = self.client().await?;
        let text = if q.newest_first {
            "SELECT seq, at_ms, actor, action, target, request_id, client, details
             FROM audit_log WHERE seq > $1 AND seq < $2 ORDER BY seq DESC LIMIT $3"
        } else {
            "SELECT seq, at_ms, actor, action, target, request_id, client, details
             FROM audit_log WHERE seq > $1 AND seq < $2 ORDER BY seq ASC LIMIT $3"
        };
        let rows = query(&c, text, &[&after, &before, &limit]).await?;
        rows.iter()
            .map(|r| {
                let details: String = col(r, 7)?;
                Ok(AuditEntry {
                    seq: col(r, 0)?,
                    entry: NewAudit {
                        at: col(r, 1)?,
                        actor: col(r, 2)?,
                        action: col(r, 3)?,
                        target: col(r, 4)?,
                        request_id: col(r, 5)?,
                        client: col(r, 6)?,
                        details: serde_json::from_str(&details).map_err(|e| {
                            StoreError::Corrupt {
                                what: "audit entry",
                                message: e.to_string(),
                            }
                        })?,
                    },
                })
            })
            .collect()
    }
}
