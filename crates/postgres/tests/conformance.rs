//! PgStore against the store conformance suite, on a real PostgreSQL: each case gets a fresh
//! database in the cluster of SANDBOXD_TEST_PG_URL, and the restart case opens the same
//! database again. The databases are dropped at the end, whether the suite passed or not.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use sandboxd_core::store::{Store, StoreError};
use sandboxd_postgres::PgStore;
use sandboxd_testkit::conformance::{StoreFactory, store_conformance};
use support::Databases;

#[async_trait]
impl StoreFactory for Databases {
    async fn fresh(&self) -> Result<(Arc<dyn Store>, String), StoreError> {
        let (name, url) = self.create().await;
        Ok((Arc::new(PgStore::open(&url).await?), name))
    }

    async fn reopen(&self, name: &str) -> Result<Arc<dyn Store>, StoreError> {
        Ok(Arc::new(PgStore::open(&self.url_of(name)).await?))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_conforms() -> anyhow::Result<()> {
    let Some(admin) = support::admin_url() else {
        return Ok(());
    };
    let databases = Databases::new(admin);
    let result = store_conformance(&databases).await;
    databases.drop_all().await;
    result
}
