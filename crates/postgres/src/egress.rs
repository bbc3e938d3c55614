//! The egress columns of `sessions` and the `egress_log` table (schema_v7.sql): each
//! session's policy, its counters and its newest connection records. A record is one
//! statement (the counters, the row and the pruning in data-modifying CTEs), so it is atomic
//! without a transaction of its own, and concurrent records of one session are serialized by
//! the session row's lock.

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt, unsigned};
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::egress::EgressRecord;
use sandboxd_core::store::egress::{MAX_RECORDS_PER_SESSION, bounded};
use sandboxd_core::store::{EgressCounters, EgressLog, StoreError};

/// BIGINT is signed: counters saturate at i64::MAX.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl EgressLog for PgStore {
    async fn set_session_egress(
        &self,
        id: &str,
        policy: &EgressPolicy,
    ) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "UPDATE sessions SET egress = $2 WHERE id = $1 AND state <> 'ended'",
            &[&id, &policy.to_string()],
        )
        .await?;
        Ok(n > 0)
    }

    async fn add_egress_record(&self, record: &EgressRecord) -> Result<(), StoreError> {
        let r = bounded(record);
        let c = self.client().await?;
        let (conn, refused): (i64, i64) = if r.allowed { (1, 0) } else { (0, 1) };
        execute(
            &c,
            "WITH s AS (
                 UPDATE sessions SET egress_seq = egress_seq + 1,
                     egress_connections = egress_connections + $2,
                     egress_refused = egress_refused + $3,
                     egress_bytes_up = egress_bytes_up + $4,
                     egress_bytes_down = egress_bytes_down + $5
                 WHERE id = $1 RETURNING egress_seq),
             ins AS (
                 INSERT INTO egress_log (session_id, seq, owner, method, host, port, allowed,
                     rule, reason, bytes_up, bytes_down, started_ms, duration_ms)
                 SELECT $1, s.egress_seq, $6, $7, $8, $9, $10, $11, $12, $4, $5, $13, $14 FROM s
                 RETURNING seq)
             DELETE FROM egress_log WHERE session_id = $1
                 AND seq <= (SELECT seq FROM ins) - $15",
            &[
                &r.session,
                &conn,
                &refused,
                &int(r.bytes_up),
                &int(r.bytes_down),
                &r.owner,
                &r.method,
                &r.host,
                &i32::from(r.port),
                &r.allowed,
                &r.rule,
                &r.reason,
                &r.started_ms,
                &int(r.duration_ms),
                &int(MAX_RECORDS_PER_SESSION),
            ],
        )
        .await?;
        Ok(())
    }

    async fn egress_counters(&self, session: &str) -> Result<EgressCounters, StoreError> {
        let c = self.client().await?;
        let row = query_opt(
            &c,
            "SELECT egress_connections, egress_refused, egress_bytes_up, egress_bytes_down
             FROM sessions WHERE id = $1",
            &[&session],
        )
        .await?;
        let Some(r) = row else {
            return Ok(EgressCounters::default());
        };
        Ok(EgressCounters {
            connections: unsigned(col(&r, 0)?),
            refused: unsigned(col(&r, 1)?),
            bytes_up: unsigned(col(&r, 2)?),
            bytes_down: unsigned(col(&r, 3)?),
        })
    }

    async fn egress_records(
        &self,
        session: &str,
        since: Option<i64>,
        limit: u32,
    ) -> Result<Vec<EgressRecord>, StoreError> {
        let c = self.client().await?;
        let rows = query(
            &c,
            "SELECT session_id, owner, method, host, port, allowed, rule, reason,
                 bytes_up, bytes_down, started_ms, duration_ms
             FROM egress_log WHERE session_id = $1 AND started_ms >= $2
             ORDER BY seq DESC LIMIT $3",
            &[&session, &since.unwrap_or(i64::MIN), &i64::from(limit)],
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EgressRecord {
                    session: col(r, 0)?,
                    owner: col(r, 1)?,
                    method: col(r, 2)?,
                    host: col(r, 3)?,
                    port: col::<i32>(r, 4)?.clamp(0, 65535) as u16,
                    allowed: col(r, 5)?,
                    rule: col(r, 6)?,
                    reason: col(r, 7)?,
                    bytes_up: unsigned(col(r, 8)?),
                    bytes_down: unsigned(col(r, 9)?),
                    started_ms: col(r, 10)?,
                    duration_ms: unsigned(col(r, 11)?),
                })
            })
            .collect()
    }
}
