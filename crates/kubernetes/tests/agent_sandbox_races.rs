//! agent-sandbox mode under concurrency and someone else's writes, against the fake API
//! server and its controller: parallel creates of one replica at the cap make one new
//! template only (the others get the 409); a claim whose template (not its pool) was deleted
//! while it waited still binds (the template is written again); and attach refuses a pod
//! that is not its Sandbox's, as the listing does.

use std::time::Duration;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Owner, SandboxError, SandboxState};
use sandboxd_kubernetes::AgentSandboxRuntime;

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

fn count(fake: &FakeApi, plural: &str) -> usize {
    fake.agent_sandbox_objects(plural, "sandboxd").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_at_the_cap_make_one_new_template() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt =
        AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0).with_max_templates(2);
    rt.write_defaults().await?;
    let (first, _) = rt.create(&session("para0", 256)).await?;
    // At cap − 1: four creates at once, each with limits of its own.
    let tasks: Vec<_> = [320u64, 384, 448, 512]
        .into_iter()
        .enumerate()
        .map(|(i, mb)| {
            let rt = rt.clone();
            tokio::spawn(async move {
                rt.create(&session(&format!("para{}", i + 1), mb))
                    .await
                    .map(|(h, _)| h)
            })
        })
        .collect();
    let mut made = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        match t.await? {
            Ok(h) => made.push(h),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(made.len(), 1, "exactly one new template: {refused:?}");
    assert_eq!(refused.len(), 3);
    for e in &refused {
        assert!(matches!(e, SandboxError::Conflict(_)), "{e:?}");
    }
    assert_eq!(count(&fake, "sandboxtemplates"), 3, "the default and two");
    assert_eq!(count(&fake, "sandboxclaims"), 2, "no refused claim left");
    rt.remove(&first).await?;
    rt.remove(&made[0]).await?;
    assert_eq!(count(&fake, "sandboxtemplates"), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_template_went_while_it_waited_still_binds() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    // The controller down first: the claim waits.
    fake.install_agent_sandbox(false)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0)
        .with_bind_timeout(Duration::from_secs(30));
    let task = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.create(&session("waits", 256)).await.map(|(h, _)| h) })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let pool = loop {
        let claims = fake.agent_sandbox_objects("sandboxclaims", "sandboxd");
        if let Some(p) = claims
            .first()
            .and_then(|c| c["spec"]["warmPoolRef"]["name"].as_str())
        {
            break p.to_string();
        }
        assert!(tokio::time::Instant::now() < deadline, "no claim was made");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(pool, "sandboxd", "a template of its own");
    // Another replica's sweep cut short: the template gone, its pool still there.
    fake.agent_sandbox_delete("sandboxtemplates", "sandboxd", &pool);
    assert_eq!(count(&fake, "sandboxwarmpools"), 1);
    fake.install_agent_sandbox(true)?;
    let handle = task.await??;
    let templates = fake.agent_sandbox_objects("sandboxtemplates", "sandboxd");
    assert!(
        templates.iter().any(|t| t["metadata"]["name"] == pool),
        "the template was written again"
    );
    rt.remove(&handle).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_listing_refuse_a_pod_not_its_sandboxs() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0);
    let (a, _) = rt.create(&session("attacha", 256)).await?;
    let (b, _) = rt.create(&session("attachb", 256)).await?;
    let (claim_b, _) = b.split_once('/').expect("a bound handle");
    let (_, pod_a) = a.split_once('/').expect("a bound handle");
    // Its own pod: attach takes it up.
    let found_a = rt.find("attacha").await?.expect("a is listed");
    assert_eq!(found_a.state, SandboxState::Running);
    rt.attach(&found_a, &Limits::default()).await?;

    // b's Sandbox now names a's pod, as a broken or hostile writer of Sandboxes would.
    let sandboxes = fake.agent_sandbox_objects("sandboxes", "sandboxd");
    let original = sandboxes
        .iter()
        .find(|s| s["metadata"]["name"] == claim_b)
        .expect("b's Sandbox")
        .clone();
    let mut moved = original.clone();
    moved["metadata"]["annotations"]["agents.x-k8s.io/pod-name"] = pod_a.into();
    fake.agent_sandbox_put("sandboxes", "sandboxd", moved);

    let listed = rt.find("attachb").await?.expect("b is listed");
    assert_eq!(listed.state, SandboxState::Stopped, "{listed:?}");
    assert_eq!(listed.handle, format!("{claim_b}/"), "no pod in its handle");
    let all = rt.list().await?;
    let b_all = all.iter().find(|f| f.session_id == "attachb").expect("b");
    assert_eq!(b_all.state, SandboxState::Stopped);
    // A handle that names a's pod under b's claim (a stored one, say) is refused.
    let mut forged = listed.clone();
    forged.handle = format!("{claim_b}/{pod_a}");
    forged.state = SandboxState::Running;
    let Err(e) = rt.attach(&forged, &Limits::default()).await else {
        panic!("b was attached to a's pod");
    };
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("the pod {pod_a}")) && msg.contains("is not owned by its Sandbox"),
        "{msg}"
    );
    fake.agent_sandbox_put("sandboxes", "sandboxd", original);
    rt.remove(&b).await?;
    rt.remove(&a).await?;
    Ok(())
}
