//! The `replicas` table (schema_v3.sql): the replica registry, its leases measured by the
//! database's clock (`NOW_MS`), so replicas whose hosts' clocks disagree agree on who is
//! alive. Each method is one statement, so each is its own transaction.

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt};
use sandboxd_core::store::{Replicas, StoreError};

/// The database's clock in unix milliseconds (`clock_timestamp`, not the transaction's
/// start: a lease is measured when the statement runs).
pub(crate) const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

#[async_trait]
impl Replicas for PgStore {
    async fn replica_beat(&self, id: &str, lease_ms: i64) -> Result<i64, StoreError> {
        let c = self.client().await?;
        let statement = format!(
            "INSERT INTO replicas (id, started_at, expires_at) VALUES ($1, {NOW_MS}, {NOW_MS} + $2)
             ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at
             RETURNING expires_at - $2"
        );
        let row = query_opt(&c, &statement, &[&id, &lease_ms.max(0)])
            .await?
            .ok_or_else(|| StoreError::Sql("the replica's beat returned no row".into()))?;
        col(&row, 0)
    }

    async fn replica_leave(&self, id: &str) -> Result<(), StoreError> {
        let c = self.client().await?;
        execute(&c, "DELETE FROM replicas WHERE id = $1", &[&id]).await?;
        Ok(())
    }

    async fn live_replicas(&self) -> Result<Vec<String>, StoreError> {
        let c = self.client().await?;
        let statement = format!("SELECT id FROM replicas WHERE expires_at > {NOW_MS} ORDER BY id");
        query(&c, &statement, &[])
            .await?
            .iter()
            .map(|r| col(r, 0))
            .collect()
    }
}
