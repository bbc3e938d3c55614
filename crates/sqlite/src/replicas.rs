//! The `replicas` table (schema_v6.sql): the replica registry. SQLite's store clock is the
//! host's (one file, one host), so leases are measured with `now_ms()`.

use async_trait::async_trait;
use rusqlite::params;

use crate::{SqliteStore, sql};
use sandboxd_core::store::{Replicas, StoreError, now_ms};

#[async_trait]
impl Replicas for SqliteStore {
    async fn replica_beat(&self, id: &str, lease_ms: i64) -> Result<i64, StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            let now = now_ms();
            tx.execute(
                "INSERT INTO replicas (id, started_at, expires_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                params![id, now, now.saturating_add(lease_ms.max(0))],
            )
            .map_err(sql)?;
            Ok(now)
        })
        .await
    }

    async fn replica_leave(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            tx.execute("DELETE FROM replicas WHERE id = ?1", params![id])
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn live_replicas(&self) -> Result<Vec<String>, StoreError> {
        self.read(move |c| {
            let mut stmt = c
                .prepare("SELECT id FROM replicas WHERE expires_at > ?1 ORDER BY id")
                .map_err(sql)?;
            let ids = stmt
                .query_map(params![now_ms()], |r| r.get(0))
                .map_err(sql)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(sql)?;
            Ok(ids)
        })
        .await
    }
}
