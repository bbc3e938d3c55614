//! The tests' Postgres: the cluster `SANDBOXD_TEST_PG_URL` names (scripts/pg-test.sh makes a
//! throw-away one), and a fresh database in it per store, dropped when the test ends, so tests
//! run in parallel without seeing each other's rows.
//!
//! Without the variable a test FAILS and says how to set it; only `SANDBOXD_TEST_PG=skip`
//! skips, loudly, so a missing cluster is never a silent pass.
#![allow(dead_code)]

use std::sync::Mutex;

use tokio_postgres::NoTls;

/// The cluster's URL, or None when the Postgres tests are skipped on purpose.
pub fn admin_url() -> Option<String> {
    match std::env::var("SANDBOXD_TEST_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("SANDBOXD_TEST_PG").as_deref() == Ok("skip") => {
            eprintln!(
                "SKIPPED: the Postgres store tests (SANDBOXD_TEST_PG=skip); nothing was tested"
            );
            None
        }
        _ => panic!(
            "SANDBOXD_TEST_PG_URL is not set: the Postgres store tests need a real cluster. Run \
             `bash scripts/pg-test.sh -- cargo test -p sandboxd-postgres` (a throw-away PostgreSQL 15 \
             cluster; apt-get install postgresql-15), or point SANDBOXD_TEST_PG_URL at a cluster \
             where the user may CREATE DATABASE (postgres://user:password@127.0.0.1:5432/postgres), \
             or set SANDBOXD_TEST_PG=skip to skip these tests knowingly"
        ),
    }
}

/// The databases one test made; `drop_all` removes them.
pub struct Databases {
    admin: String,
    prefix: String,
    made: Mutex<Vec<String>>,
}

async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to SANDBOXD_TEST_PG_URL: {e:?}"));
    tokio::spawn(connection);
    client
}

impl Databases {
    pub fn new(admin: String) -> Self {
        let prefix = format!("sbx_test_{}", uuid::Uuid::new_v4().simple());
        Self {
            admin,
            prefix,
            made: Mutex::new(Vec::new()),
        }
    }

    /// A new, empty database: its name and URL.
    pub async fn create(&self) -> (String, String) {
        let name = {
            let mut made = self.made.lock().unwrap();
            let name = format!("{}_{}", self.prefix, made.len());
            made.push(name.clone());
            name
        };
        let client = admin_client(&self.admin).await;
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e:?}"));
        let url = self.url_of(&name);
        (name, url)
    }

    /// The URL of database `name` in the same cluster, as the same user.
    pub fn url_of(&self, name: &str) -> String {
        let mut url = url::Url::parse(&self.admin).expect("SANDBOXD_TEST_PG_URL is a URL");
        url.set_path(&format!("/{name}"));
        url.to_string()
    }

    /// Drops every database this test made (connections still open are ended).
    pub async fn drop_all(&self) {
        let names = std::mem::take(&mut *self.made.lock().unwrap());
        let client = admin_client(&self.admin).await;
        for name in names {
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .unwrap_or_else(|e| panic!("DROP DATABASE {name}: {e:?}"));
        }
    }
}
