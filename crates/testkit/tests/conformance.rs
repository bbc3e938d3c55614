//! The fake runtime against the runtime conformance suite: what tests built on the fake may
//! take for granted of it is what a real backend also does (labels, find/list, attach,
//! liveness, remove). The fake runs no processes and enforces no limits; it says so in its caps.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::sync::Arc;

use sandboxd_core::sandbox::Runtime;
use sandboxd_core::sandbox::vanished::VanishKind;
use sandboxd_testkit::conformance::{
    OutOfBand, RuntimeCaps, runtime_conformance, vanish_conformance,
};
use sandboxd_testkit::fake_runtime::FakeRuntime;

#[tokio::test]
async fn the_fake_runtime_conforms() -> anyhow::Result<()> {
    let rt: Arc<dyn Runtime> = FakeRuntime::new();
    let caps = RuntimeCaps {
        runs_processes: false,
        enforces_memory: false,
    };
    runtime_conformance(rt, caps).await
}

/// The fake's sandboxes deleted behind its back: `FakeRuntime::vanish`.
struct FakeOutOfBand(Arc<FakeRuntime>);

#[async_trait::async_trait]
impl OutOfBand for FakeOutOfBand {
    async fn delete(&self, handle: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.0.vanish(handle, VanishKind::Deleted),
            "no sandbox {handle}"
        );
        Ok(())
    }
}

#[tokio::test]
async fn the_fake_runtime_reports_sandboxes_deleted_out_of_band() -> anyhow::Result<()> {
    let rt = FakeRuntime::new();
    vanish_conformance(rt.clone(), Arc::new(FakeOutOfBand(rt))).await
}
