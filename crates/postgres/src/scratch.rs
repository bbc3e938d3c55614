//! Throw-away databases in a cluster, for `sandboxd bench serve`'s replicas: one made with a
//! random name, the store opened on its URL, and dropped after. Here because only this crate
//! talks to PostgreSQL; the store itself never creates or drops a database.

use sandboxd_core::store::StoreError;
use tokio_postgres::NoTls;

use crate::{chain, parse_url, redacted};

/// A database this process made in a cluster; `drop_database` removes it. Not dropped on
/// `Drop` (that would need a connection in a destructor): a caller that fails before dropping
/// it leaves a database named `<prefix>_<hex>` behind.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Its name in the cluster.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of the database itself, as the admin URL's user (with its password).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database, ending connections to it that are still open (`WITH (FORCE)`,
    /// PostgreSQL 13 and later).
    pub async fn drop_database(self) -> Result<(), StoreError> {
        let client = admin(&self.admin_url).await?;
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .await
            .map_err(|e| open_error(&self.admin_url, &e))
    }
}

/// Creates an empty database named `<prefix>_<32 random hex>` in the cluster `admin_url` names
/// (its user must be allowed to CREATE DATABASE). `prefix` must be a plain SQL identifier
/// (lowercase letters, digits, `_`).
pub async fn create_scratch_database(
    admin_url: &str,
    prefix: &str,
) -> Result<ScratchDatabase, StoreError> {
    if prefix.is_empty()
        || !prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(StoreError::Open {
            path: redacted(admin_url),
            message: format!("{prefix:?} is not a plain database name prefix"),
        });
    }
    let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let url = with_database(admin_url, &name)?;
    let client = admin(admin_url).await?;
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .map_err(|e| open_error(admin_url, &e))?;
    Ok(ScratchDatabase {
        admin_url: admin_url.to_string(),
        name,
        url,
    })
}

/// One connection to the cluster, for the statements a transaction block cannot hold.
async fn admin(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = parse_url(url)?
        .connect(NoTls)
        .await
        .map_err(|e| open_error(url, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the scratch database's admin connection ended");
        }
    });
    Ok(client)
}

fn open_error(url: &str, e: &dyn std::error::Error) -> StoreError {
    StoreError::Open {
        path: redacted(url),
        message: chain(e),
    }
}

/// `url` with its path (the database) replaced by `name`; the user, password, host and query
/// parameters are kept as written.
fn with_database(url: &str, name: &str) -> Result<String, StoreError> {
    parse_url(url)?;
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(StoreError::Open {
            path: redacted(url),
            message: "not a postgres:// URL".into(),
        });
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let query = tail.split_once('?').map(|(_, q)| q);
    // A `dbname=` parameter would win over the path; the scratch database must.
    let query: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty() && !p.to_ascii_lowercase().starts_with("dbname="))
        .collect();
    let mut out = format!("{scheme}://{authority}/{name}");
    if !query.is_empty() {
        out.push('?');
        out.push_str(&query.join("&"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_is_replaced_and_the_rest_kept() {
        for (url, expected) in [
            (
                "postgres://u:p@127.0.0.1:5432/postgres",
                "postgres://u:p@127.0.0.1:5432/x",
            ),
            ("postgres://u:p@db", "postgres://u:p@db/x"),
            (
                "postgresql://u@db/other?sslmode=disable&dbname=y",
                "postgresql://u@db/x?sslmode=disable",
            ),
            ("postgres://db?user=u", "postgres://db/x?user=u"),
        ] {
            assert_eq!(with_database(url, "x").ok().as_deref(), Some(expected));
        }
        assert!(with_database("mysql://db/x", "x").is_err());
    }
}
