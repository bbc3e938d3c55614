//! The `egress_credentials` table (schema_v10.sql): users' credentials for the egress proxy,
//! their values sealed by the caller (the store never holds a clear value nor the key).
//!
//! The bound per owner is one transaction that first locks the owner's user row, so two
//! concurrent attaches of one owner are serialized and cannot pass the bound together.

use async_trait::async_trait;

use crate::{PgStore, col, execute, query, query_opt, sql};
use sandboxd_core::store::{EgressCredentials, StoreError, StoredCredential};

#[async_trait]
impl EgressCredentials for PgStore {
    async fn put_egress_credential(
        &self,
        cred: &StoredCredential,
        max_per_owner: u32,
    ) -> Result<bool, StoreError> {
        let c = cred;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(sql)?;
        query_opt(
            &tx,
            "SELECT id FROM users WHERE id = $1 FOR UPDATE",
            &[&c.owner],
        )
        .await?;
        let row = query(
            &tx,
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE host = $2)
             FROM egress_credentials WHERE owner = $1",
            &[&c.owner, &c.host],
        )
        .await?;
        let (held, replaces): (i64, i64) = match row.first() {
            Some(r) => (col(r, 0)?, col(r, 1)?),
            None => (0, 0),
        };
        if replaces == 0 && held >= i64::from(max_per_owner) {
            return Err(StoreError::CredentialQuota {
                limit: max_per_owner,
            });
        }
        execute(
            &tx,
            "INSERT INTO egress_credentials
                 (owner, host, header, prefix, allow_http, sealed, created_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (owner, host) DO UPDATE SET header = excluded.header,
                 prefix = excluded.prefix, allow_http = excluded.allow_http,
                 sealed = excluded.sealed, created_ms = excluded.created_ms",
            &[
                &c.owner,
                &c.host,
                &c.header,
                &c.prefix,
                &c.allow_http,
                &c.sealed,
                &c.created_ms,
            ],
        )
        .await?;
        tx.commit().await.map_err(sql)?;
        Ok(replaces > 0)
    }

    async fn egress_credentials(&self, owner: &str) -> Result<Vec<StoredCredential>, StoreError> {
        let c = self.client().await?;
        let rows = query(
            &c,
            "SELECT owner, host, header, prefix, allow_http, sealed, created_ms
             FROM egress_credentials WHERE owner = $1 ORDER BY host",
            &[&owner],
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredCredential {
                    owner: col(r, 0)?,
                    host: col(r, 1)?,
                    header: col(r, 2)?,
                    prefix: col(r, 3)?,
                    allow_http: col(r, 4)?,
                    sealed: col(r, 5)?,
                    created_ms: col(r, 6)?,
                })
            })
            .collect()
    }

    async fn remove_egress_credential(&self, owner: &str, host: &str) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = execute(
            &c,
            "DELETE FROM egress_credentials WHERE owner = $1 AND host = $2",
            &[&owner, &host],
        )
        .await?;
        Ok(n > 0)
    }
}
