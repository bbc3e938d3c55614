//! Store conformance case of hibernated sessions (issue 28, item 5): a running session is
//! marked hibernated only when unused since the snapshot began and with no run in flight,
//! once; it still counts in its owner's quota; it resumes once, only with its own snapshot;
//! the idle end ends only hibernated sessions past their own timeout and names their
//! snapshots; the runtime-id idle end never ends a hibernated one; the template and the
//! session's environment are kept.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::store::{
    RunPatch, RunRow, RunState, SessionRow, SessionState, Store, StoreError, now_ms,
};

use super::store::{StoreFactory, add_user, fresh};

async fn row_of(store: &dyn Store, id: &str) -> Result<SessionRow> {
    store
        .session(id)
        .await?
        .ok_or_else(|| anyhow!("session {id} is missing"))
}

pub(super) async fn case_hibernation(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let t0 = now_ms();
    let env = BTreeMap::from([
        ("A".to_string(), "1".to_string()),
        ("TOKEN".to_string(), "x y='z' \"\u{e9}\n".to_string()),
    ]);
    let new = |id: &str, template: Option<&str>| {
        let env = if template.is_some() {
            env.clone()
        } else {
            BTreeMap::new()
        };
        SessionRow::creating(id, &ann, Limits::default(), BTreeMap::new(), 10, t0)
            .with_template(template.map(str::to_string))
            .with_env(env)
    };
    store.reserve_session(new("z0", Some("data")), 2).await?;
    store.reserve_session(new("z1", None), 2).await?;
    ensure!(
        !store.hibernate_session("z0", "z0.a.tar", t0).await?,
        "a session still being created is not hibernated"
    );
    store.session_started("z0", "rt-z0", "c-z0").await?;
    store.session_started("z1", "rt-z1", "c-z1").await?;
    let z0 = row_of(&*store, "z0").await?;
    ensure!(
        z0.template.as_deref() == Some("data") && z0.snapshot.is_none() && !z0.hibernated(),
        "the template is kept and a new session is not hibernated: {z0:?}"
    );
    ensure!(
        z0.env.0 == env && row_of(&*store, "z1").await?.env.0.is_empty(),
        "the environment is kept exactly, an empty one stays empty: {:?}",
        z0.env
    );
    store.touch_session("z0", t0 + 5_000).await?;
    ensure!(
        !store
            .hibernate_session("z0", "z0.a.tar", t0 + 4_999)
            .await?,
        "a session used after the snapshot began is not hibernated"
    );
    store.insert_run(run_row("rz0", "z0", &ann), 5).await?;
    ensure!(
        !store
            .hibernate_session("z0", "z0.a.tar", t0 + 6_000)
            .await?,
        "a session with a run in flight is not hibernated"
    );
    let done = RunPatch {
        state: Some(RunState::Succeeded),
        ended_at: Some(t0 + 1),
        ..Default::default()
    };
    store.patch_run("rz0", done).await?;
    ensure!(
        store
            .hibernate_session("z0", "z0.a.tar", t0 + 6_000)
            .await?,
        "an idle session is hibernated"
    );
    ensure!(
        !store
            .hibernate_session("z0", "z0.b.tar", t0 + 6_000)
            .await?,
        "a hibernated session is not hibernated again"
    );
    let z0 = row_of(&*store, "z0").await?;
    ensure!(
        z0.hibernated() && z0.snapshot.as_deref() == Some("z0.a.tar"),
        "the row names its snapshot: {z0:?}"
    );
    ensure!(
        store.active_sessions().await?.iter().any(|r| r.id == "z0"),
        "a hibernated session is active"
    );
    match store.reserve_session(new("z2", None), 2).await {
        Err(StoreError::SessionQuota { .. }) => {}
        other => {
            return Err(anyhow!(
                "a hibernated session counts in the quota: {other:?}"
            ));
        }
    }
    ensure!(
        store
            .end_idle_session("rt-z0", "idle", t0 + 60_000)
            .await?
            .is_none(),
        "the runtime-id idle end never ends a hibernated session (its sandbox is gone)"
    );
    ensure!(
        !store
            .resume_session("z0", "other.tar", "c-z0b", t0 + 7_000)
            .await?,
        "a resume with another snapshot is refused"
    );
    ensure!(
        store
            .resume_session("z0", "z0.a.tar", "c-z0b", t0 + 7_000)
            .await?,
        "a hibernated session resumes"
    );
    ensure!(
        !store
            .resume_session("z0", "z0.a.tar", "c-z0c", t0 + 7_000)
            .await?,
        "it resumes once"
    );
    let z0 = row_of(&*store, "z0").await?;
    ensure!(
        !z0.hibernated()
            && z0.container_id.as_deref() == Some("c-z0b")
            && z0.last_used_at == t0 + 7_000
            && z0.runtime_id.as_deref() == Some("rt-z0")
            && z0.env.0 == env,
        "resumed: new container, same runtime id and environment, used now: {z0:?}"
    );
    // The idle end of hibernated sessions: z0 hibernated again, z1 too, at other times.
    ensure!(
        store
            .hibernate_session("z0", "z0.c.tar", t0 + 7_000)
            .await?
    );
    store.touch_session("z1", t0 + 20_000).await?;
    ensure!(
        store
            .hibernate_session("z1", "z1.a.tar", t0 + 20_000)
            .await?
    );
    let ended = store.end_idle_hibernated("idle", t0 + 16_999).await?;
    ensure!(ended.is_empty(), "none idle yet: {ended:?}");
    let ended = store.end_idle_hibernated("idle", t0 + 17_000).await?;
    ensure!(
        ended == vec![("z0".to_string(), "z0.c.tar".to_string())],
        "z0 idled out, z1 not yet: {ended:?}"
    );
    let z0 = row_of(&*store, "z0").await?;
    ensure!(
        z0.state == SessionState::Ended && z0.end_reason.as_deref() == Some("idle"),
        "ended with its reason: {z0:?}"
    );
    ensure!(
        z0.env.0.is_empty(),
        "an ended session keeps no environment (its values may be secrets): {z0:?}"
    );
    ensure!(
        store
            .end_idle_hibernated("idle", t0 + 17_000)
            .await?
            .is_empty(),
        "ended once"
    );
    ensure!(
        !store
            .resume_session("z0", "z0.c.tar", "c", t0 + 18_000)
            .await?,
        "an ended session does not resume"
    );
    Ok(())
}

fn run_row(id: &str, session: &str, owner: &str) -> RunRow {
    RunRow::queued(id, session, owner, "a task", "agent", Some(5), now_ms())
}
