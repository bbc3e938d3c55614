//! SqliteStore against the store conformance suite: each case gets a fresh file in one temp
//! directory, and the restart case opens the same file again.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use sandboxd_core::store::{Store, StoreError};
use sandboxd_sqlite::SqliteStore;
use sandboxd_testkit::conformance::{StoreFactory, store_conformance};

struct Files {
    dir: tempfile::TempDir,
    next: AtomicU32,
}

#[async_trait]
impl StoreFactory for Files {
    async fn fresh(&self) -> Result<(Arc<dyn Store>, String), StoreError> {
        let name = format!("store-{}.db", self.next.fetch_add(1, Ordering::Relaxed));
        let store = SqliteStore::open(&self.dir.path().join(&name)).await?;
        Ok((Arc::new(store), name))
    }

    async fn reopen(&self, name: &str) -> Result<Arc<dyn Store>, StoreError> {
        Ok(Arc::new(
            SqliteStore::open(&self.dir.path().join(name)).await?,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_conforms() -> anyhow::Result<()> {
    let files = Files {
        dir: tempfile::tempdir()?,
        next: AtomicU32::new(0),
    };
    store_conformance(&files).await
}
