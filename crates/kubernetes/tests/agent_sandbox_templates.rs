//! agent-sandbox mode's templates and bound pods against the fake API server and its minimal
//! controller: the templates made for other limits are capped (a create over the cap is
//! refused with what to do, and leaves no claim) and deleted once no claim uses them, the
//! default one never; a template someone else changed is written back exactly; and a claim
//! bound to a pod that is not its Sandbox's (another session's) is refused and deleted, the
//! other session untouched.

use std::collections::BTreeSet;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Owner, SandboxError, ShellOptions};
use sandboxd_kubernetes::AgentSandboxRuntime;
use sandboxd_kubernetes::agent_sandbox::objects;
use serde_json::{Value, json};

use crate::conformance::runtime;
use crate::fake::FakeApi;

fn session(id: &str, memory_mb: u64) -> SandboxSpec {
    SandboxSpec {
        session_id: id.into(),
        owner: Owner::new("alice").ok(),
        pooled: false,
        limits: Limits {
            memory_mb,
            ..Limits::default()
        },
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    }
}

fn names(fake: &FakeApi, plural: &str) -> BTreeSet<String> {
    fake.agent_sandbox_objects(plural, "sandboxd")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The template a claim of this handle was made from.
fn pool_of(fake: &FakeApi, handle: &str) -> String {
    let claim = handle.split_once('/').map(|(c, _)| c).unwrap_or(handle);
    fake.agent_sandbox_objects("sandboxclaims", "sandboxd")
        .iter()
        .find(|c| c["metadata"]["name"] == claim)
        .and_then(|c| c["spec"]["warmPoolRef"]["name"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_capped_and_deleted_when_no_claim_uses_them() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt =
        AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0).with_max_templates(2);
    rt.write_defaults().await?;
    let (a, _) = rt.create(&session("tmpla", 256)).await?;
    let (b, _) = rt.create(&session("tmplb", 320)).await?;
    let (ta, tb) = (pool_of(&fake, &a), pool_of(&fake, &b));
    assert!(ta.starts_with("sandboxd-") && tb.starts_with("sandboxd-") && ta != tb);
    let all = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        names(&fake, "sandboxtemplates"),
        all(&["sandboxd", &ta, &tb])
    );

    // A third set of limits: over the cap, refused with what to do; nothing left behind.
    let over = rt.create(&session("tmplc", 384)).await;
    let Err(e) = over else {
        panic!("a template over the cap was made");
    };
    assert!(matches!(e, SandboxError::Conflict(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("2 SandboxTemplates") && msg.contains("default limits"),
        "{msg}"
    );
    assert_eq!(
        fake.agent_sandbox_objects("sandboxclaims", "sandboxd")
            .len(),
        2
    );
    // Limits a template already exists for are no new template: allowed at the cap.
    let (b2, _) = rt.create(&session("tmplb2", 320)).await?;
    assert_eq!(pool_of(&fake, &b2), tb);

    // The last claim of a template removed: the template and its pool go with it.
    rt.remove(&a).await?;
    assert_eq!(names(&fake, "sandboxtemplates"), all(&["sandboxd", &tb]));
    assert_eq!(names(&fake, "sandboxwarmpools"), all(&["sandboxd", &tb]));
    // One of two claims of a template removed: it stays.
    rt.remove(&b).await?;
    assert!(names(&fake, "sandboxtemplates").contains(&tb));
    // Room again under the cap.
    let (c, sb) = rt.create(&session("tmplc", 384)).await?;
    let out = sb.shell("echo fits", ShellOptions::default()).await?;
    assert_eq!(out.stdout_lossy(), "fits\n");
    rt.remove(&b2).await?;
    rt.remove(&c).await?;
    assert_eq!(
        names(&fake, "sandboxtemplates"),
        all(&["sandboxd"]),
        "only the default template is left, never swept"
    );
    assert_eq!(names(&fake, "sandboxwarmpools"), all(&["sandboxd"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_someone_changed_is_written_back_exactly() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt = runtime(&fake).await;
    AgentSandboxRuntime::new(rt.clone(), Limits::default(), 0)
        .write_defaults()
        .await?;
    let ours = fake
        .agent_sandbox_objects("sandboxtemplates", "sandboxd")
        .pop()
        .expect("the default template");
    // Someone adds a container beside ours: every field sandboxd set is still there.
    let mut changed = ours.clone();
    changed["spec"]["podTemplate"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(json!({"name": "sidecar", "image": "registry.example/exfiltrate:1"}));
    fake.agent_sandbox_put("sandboxtemplates", "sandboxd", changed);
    // The next process to start writes it back.
    AgentSandboxRuntime::new(rt, Limits::default(), 0)
        .write_defaults()
        .await?;
    let now: Value = fake
        .agent_sandbox_objects("sandboxtemplates", "sandboxd")
        .pop()
        .expect("the default template");
    assert_eq!(now["spec"], ours["spec"], "the sidecar is gone");
    assert_eq!(now["metadata"]["name"], objects::DEFAULT_POOL);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_bound_to_a_pod_not_its_sandboxs_is_refused_and_deleted() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0);
    let (first, sb) = rt.create(&session("bound1", 256)).await?;
    let pod = first.split_once('/').map(|(_, p)| p).unwrap_or_default();
    // The next claim is bound to a Sandbox that names the first session's pod.
    fake.misbind_next(pod);
    let made = rt.create(&session("bound2", 256)).await;
    let Err(e) = made else {
        panic!("a session was given another session's pod");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("SandboxClaim sandboxd-bound2")
            && msg.contains(&format!("the pod {pod}"))
            && msg.contains("is not owned by its Sandbox")
            && msg.contains("the claim is deleted"),
        "{msg}"
    );
    let claims = names(&fake, "sandboxclaims");
    assert_eq!(claims, BTreeSet::from(["sandboxd-bound1".to_string()]));
    // The first session and its pod are untouched.
    let out = sb.shell("echo still mine", ShellOptions::default()).await?;
    assert_eq!(out.stdout_lossy(), "still mine\n");
    assert!(rt.find("bound1").await?.is_some());
    rt.remove(&first).await?;
    Ok(())
}
