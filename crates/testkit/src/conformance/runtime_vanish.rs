//! The runtime conformance case of sandboxes that end outside sandboxd (`Runtime::vanished`):
//! a sandbox removed behind the runtime's back is reported, with its session id and the kind
//! `Deleted`; one removed through the runtime is not.
//!
//! Removing a sandbox behind a runtime's back is the backend's business (`docker rm -f`, a
//! pod deleted through the API server), so each backend's test gives an `OutOfBand`. The
//! case follows the reports before it makes anything, removes one sandbox through the
//! runtime and only then the other out of band: reports come in the order things happened,
//! so the first report of either of its sandboxes must be the second one's. Reports of other
//! tests' sandboxes (they share the engine) are skipped.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use async_trait::async_trait;
use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::Owner;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::vanished::{VanishKind, Vanished};
use tokio::sync::broadcast::error::RecvError;

use super::run_case;

/// How long the case waits for a report: a bound on a wait for an event, not a pause.
const REPORT_WAIT: Duration = Duration::from_secs(60);

/// Ends a sandbox as someone other than sandboxd would.
#[async_trait]
pub trait OutOfBand: Send + Sync {
    /// Deletes the sandbox `handle` names behind the runtime's back.
    async fn delete(&self, handle: &str) -> Result<()>;
}

/// Runs the case against `rt`, whose sandboxes `oob` can delete behind its back.
pub async fn vanish_conformance(rt: Arc<dyn Runtime>, oob: Arc<dyn OutOfBand>) -> Result<()> {
    let mut handles = Vec::new();
    let outcome = run_case(
        "runtime",
        "case_vanished_out_of_band",
        case_vanished(&rt, oob.as_ref(), &mut handles),
    )
    .await;
    for handle in handles {
        if let Err(e) = rt.remove(&handle).await {
            eprintln!("[runtime] case_vanished_out_of_band: could not remove {handle}: {e}");
        }
    }
    outcome
}

fn spec(what: &str) -> Result<SandboxSpec> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    Ok(SandboxSpec {
        session_id: format!("conf{what}{}x{nanos:x}", std::process::id()),
        owner: Some(Owner::new("conformance")?),
        pooled: false,
        limits: Limits {
            memory_mb: 256,
            cpus: 0.5,
            pids: 128,
            workspace_mb: 64,
            tmp_mb: 32,
            ..Limits::default()
        },
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    })
}

async fn case_vanished(
    rt: &Arc<dyn Runtime>,
    oob: &dyn OutOfBand,
    handles: &mut Vec<String>,
) -> Result<()> {
    let mut reports = rt.vanished();
    let ours = spec("vanishours")?;
    let theirs = spec("vanishtheirs")?;
    let (our_handle, _) = rt.create(&ours).await.context("create")?;
    handles.push(our_handle.clone());
    let (their_handle, their_sandbox) = rt.create(&theirs).await.context("create")?;
    handles.push(their_handle.clone());
    rt.remove(&our_handle)
        .await
        .context("remove through the runtime")?;
    oob.delete(&their_handle)
        .await
        .context("delete out of band")?;
    let first = tokio::time::timeout(REPORT_WAIT, next_of(&mut reports, handles))
        .await
        .map_err(|_| {
            anyhow!("no report within {REPORT_WAIT:?} of a sandbox deleted out of band")
        })??;
    ensure!(
        first.handle == their_handle,
        "the first report is of the sandbox removed through the runtime, which must never be reported: {first:?}"
    );
    ensure!(
        first.session_id == theirs.session_id,
        "the report names the session the sandbox recorded: {first:?}"
    );
    ensure!(
        first.kind == VanishKind::Deleted,
        "a sandbox deleted out of band is reported as Deleted: {first:?}"
    );
    ensure!(
        !their_sandbox.is_alive().await,
        "a reported sandbox is not alive"
    );
    Ok(())
}

/// The next report of one of `handles`.
async fn next_of(
    reports: &mut tokio::sync::broadcast::Receiver<Vanished>,
    handles: &[String],
) -> Result<Vanished> {
    loop {
        match reports.recv().await {
            Ok(r) if handles.contains(&r.handle) => return Ok(r),
            Ok(_) => {}
            Err(RecvError::Lagged(n)) => {
                eprintln!("[runtime] {n} reports of other sandboxes skipped")
            }
            Err(RecvError::Closed) => {
                return Err(anyhow!(
                    "the runtime reports no sandboxes that end outside sandboxd (its vanished() is closed)"
                ));
            }
        }
    }
}
