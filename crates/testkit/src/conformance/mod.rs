//! Conformance suites for the two seams a second backend implements: `store_conformance`
//! (every `Store` behaviour the service relies on) and `runtime_conformance` (every `Runtime`
//! and `Sandbox` behaviour the session manager and the tools rely on).
//!
//! Each suite is written against the traits only, so a new backend (a PostgreSQL store, a
//! Kubernetes runtime) runs it unchanged from its own test target; today the SQLite store,
//! the Docker runtime and the fake runtime do (crates/{sqlite,docker,testkit}/tests/conformance.rs).
//! A suite is a list of `case_…` functions run in order; the first failure is returned with
//! the case's name, so a backend's author sees which promise it broke.

pub mod runtime;
pub mod runtime_vanish;
pub mod store;
mod store_audit;
mod store_contexts;
mod store_credentials;
mod store_edges;
mod store_egress;
mod store_metering;
mod store_records;
mod store_replicas;
mod store_runs;
mod store_sessions;
mod store_snapshots;
mod store_sso;
mod store_tokens;
mod store_users;
mod store_wakes;

pub use runtime::{RuntimeCaps, runtime_conformance};
pub use runtime_vanish::{OutOfBand, vanish_conformance};
pub use store::{StoreFactory, store_conformance};

use std::future::Future;

/// Runs one case, naming it in the error and on stderr (cargo shows stderr of a failed test).
async fn run_case<F>(suite: &str, name: &str, case: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let started = std::time::Instant::now();
    let r = case.await;
    match &r {
        Ok(()) => eprintln!("[{suite}] {name}: ok in {:.1?}", started.elapsed()),
        Err(e) => eprintln!("[{suite}] {name}: FAILED: {e:#}"),
    }
    r.map_err(|e| e.context(format!("{suite} conformance case {name}")))
}
