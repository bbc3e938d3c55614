//! The `egress_credentials` table (schema_v11.sql): users' credentials for the egress proxy,
//! their values sealed by the caller (the store never holds a clear value nor the key).

use async_trait::async_trait;
use rusqlite::params;

use crate::{SqliteStore, sql};
use sandboxd_core::store::{EgressCredentials, StoreError, StoredCredential};

#[async_trait]
impl EgressCredentials for SqliteStore {
    async fn put_egress_credential(
        &self,
        cred: &StoredCredential,
        max_per_owner: u32,
    ) -> Result<bool, StoreError> {
        let c = cred.clone();
        self.write(move |tx| {
            let (held, replaces): (i64, i64) = tx
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(host = ?2), 0)
                     FROM egress_credentials WHERE owner = ?1",
                    params![c.owner, c.host],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(sql)?;
            if replaces == 0 && held >= i64::from(max_per_owner) {
                return Err(StoreError::CredentialQuota {
                    limit: max_per_owner,
                });
            }
            tx.execute(
                "INSERT INTO egress_credentials
                     (owner, host, header, prefix, allow_http, sealed, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (owner, host) DO UPDATE SET header = excluded.header,
                     prefix = excluded.prefix, allow_http = excluded.allow_http,
                     sealed = excluded.sealed, created_ms = excluded.created_ms",
                params![
                    c.owner,
                    c.host,
                    c.header,
                    c.prefix,
                    c.allow_http,
                    c.sealed,
                    c.created_ms
                ],
            )
            .map_err(sql)?;
            Ok(replaces > 0)
        })
        .await
    }

    async fn egress_credentials(&self, owner: &str) -> Result<Vec<StoredCredential>, StoreError> {
        let owner = owner.to_string();
        self.read(move |c| {
            let mut st = c
                .prepare(
                    "SELECT owner, host, header, prefix, allow_http, sealed, created_ms
                     FROM egress_credentials WHERE owner = ?1 ORDER BY host",
                )
                .map_err(sql)?;
            let rows = st
                .query_map([owner], |r| {
                    Ok(StoredCredential {
                        owner: r.get(0)?,
                        host: r.get(1)?,
                        header: r.get(2)?,
                        prefix: r.get(3)?,
                        allow_http: r.get(4)?,
                        sealed: r.get(5)?,
                        created_ms: r.get(6)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<Result<_, _>>().map_err(sql)
        })
        .await
    }

    async fn remove_egress_credential(&self, owner: &str, host: &str) -> Result<bool, StoreError> {
        let (owner, host) = (owner.to_string(), host.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "DELETE FROM egress_credentials WHERE owner = ?1 AND host = ?2",
                    params![owner, host],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }
}
