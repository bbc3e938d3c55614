//! The egress columns of `sessions` and the `egress_log` table (schema_v10.sql): each
//! session's policy, its counters and its newest connection records.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use crate::{SqliteStore, sql};
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::egress::EgressRecord;
use sandboxd_core::store::egress::{MAX_RECORDS_PER_SESSION, bounded};
use sandboxd_core::store::{EgressCounters, EgressLog, StoreError};

/// SQLite integers are signed: counters saturate at i64::MAX.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl EgressLog for SqliteStore {
    async fn set_session_egress(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<bool, StoreError> {
        let (id, policy) = (id.to_string(), policy.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE sessions SET egress = ?2 WHERE id = ?1 AND state != 'ended'",
                    params![id, policy],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn add_egress_record(&self, record: &EgressRecord) -> Result<(), StoreError> {
        let r = bounded(record);
        self.write(move |tx| {
            let (conn, refused) = if r.allowed { (1, 0) } else { (0, 1) };
            let seq: Option<i64> = tx
                .query_row(
                    "UPDATE sessions SET egress_seq = egress_seq + 1,
                        egress_connections = egress_connections + ?2,
                        egress_refused = egress_refused + ?3,
                        egress_bytes_up = egress_bytes_up + ?4,
                        egress_bytes_down = egress_bytes_down + ?5
                     WHERE id = ?1 RETURNING egress_seq",
                    params![r.session, conn, refused, int(r.bytes_up), int(r.bytes_down)],
                    |row| row.get(0),
                )
                .optional()
                .map_err(sql)?;
            let Some(seq) = seq else {
                return Ok(());
            };
            tx.execute(
                "INSERT INTO egress_log (session_id, seq, owner, method, host, port, allowed, rule,
                    reason, bytes_up, bytes_down, started_ms, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    r.session,
                    seq,
                    r.owner,
                    r.method,
                    r.host,
                    r.port,
                    r.allowed,
                    r.rule,
                    r.reason,
                    int(r.bytes_up),
                    int(r.bytes_down),
                    r.started_ms,
                    int(r.duration_ms)
                ],
            )
            .map_err(sql)?;
            tx.execute(
                "DELETE FROM egress_log WHERE session_id = ?1 AND seq <= ?2",
                params![r.session, seq - int(MAX_RECORDS_PER_SESSION)],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn egress_counters(&self, session: &str) -> Result<EgressCounters, StoreError> {
        let session = session.to_string();
        self.read(move |c| {
            let row = c
                .query_row(
                    "SELECT egress_connections, egress_refused, egress_bytes_up, egress_bytes_down
                     FROM sessions WHERE id = ?1",
                    [session],
                    |r| {
                        let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                        Ok(EgressCounters {
                            connections: n(0)?,
                            refused: n(1)?,
                            bytes_up: n(2)?,
                            bytes_down: n(3)?,
                        })
                    },
                )
                .optional()
                .map_err(sql)?;
            Ok(row.unwrap_or_default())
        })
        .await
    }

    async fn egress_records(
        &self,
        session: &str,
        since: Option<i64>,
        limit: u32,
    ) -> Result<Vec<EgressRecord>, StoreError> {
        let session = session.to_string();
        self.read(move |c| {
            let mut st = c
                .prepare(
                    "SELECT session_id, owner, method, host, port, allowed, rule, reason,
                        bytes_up, bytes_down, started_ms, duration_ms
                     FROM egress_log WHERE session_id = ?1 AND started_ms >= ?2
                     ORDER BY seq DESC LIMIT ?3",
                )
                .map_err(sql)?;
            let rows = st
                .query_map(
                    params![session, since.unwrap_or(i64::MIN), i64::from(limit)],
                    |r| {
                        let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                        Ok(EgressRecord {
                            session: r.get(0)?,
                            owner: r.get(1)?,
                            method: r.get(2)?,
                            host: r.get(3)?,
                            port: r.get::<_, i64>(4)?.clamp(0, 65535) as u16,
                            allowed: r.get(5)?,
                            rule: r.get(6)?,
                            reason: r.get(7)?,
                            bytes_up: n(8)?,
                            bytes_down: n(9)?,
                            started_ms: r.get(10)?,
                            duration_ms: n(11)?,
                        })
                    },
                )
                .map_err(sql)?;
            rows.collect::<Result<_, _>>().map_err(sql)
        })
        .await
    }
}
