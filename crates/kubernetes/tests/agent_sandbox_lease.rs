//! The reconciler in agent-sandbox mode: the claims carry the creator, so another replica's
//! reconcile removes the claim of a replica whose Lease ran out (and its Sandbox and pod go
//! with it), never a live replica's.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, PostParams};
use sandboxd_core::config::{Limits, SessionsConfig};
use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_kubernetes::agent_sandbox::objects;
use sandboxd_kubernetes::{AgentSandboxRuntime, KubeRuntime, PodSettings};

use crate::conformance::image;
use crate::fake::FakeApi;

fn session(id: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: id.into(),
        owner: None,
        pooled: false,
        limits: Limits {
            memory_mb: 256,
            ..Limits::default()
        },
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    }
}

const DEAD: &str = "sandboxd-replica-dead00000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_removes_claims_of_expired_leases_and_keeps_live_ones() -> anyhow::Result<()>
{
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let settings = PodSettings {
        image: image().await,
        ..PodSettings::default()
    };
    let claims_of = |rt: KubeRuntime| AgentSandboxRuntime::new(rt, Limits::default(), 0);
    let live_pods = KubeRuntime::new(
        fake.client()?,
        PodSettings {
            lease_secs: 3600,
            ..settings.clone()
        },
    );
    let live = claims_of(live_pods.clone());
    let (a, b) = ("asblivea1", "asbdeadb1");
    live.create(&session(a)).await?;
    // A replica that crashed two minutes ago: its Lease, and a claim it made (bound by the
    // controller like any other).
    let old = Timestamp::try_from(SystemTime::now() - Duration::from_secs(120))?;
    let dead = Lease {
        metadata: ObjectMeta {
            name: Some(DEAD.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("gone/1:1".into()),
            lease_duration_seconds: Some(30),
            renew_time: Some(MicroTime(old)),
            ..LeaseSpec::default()
        }),
    };
    let leases: Api<Lease> = Api::namespaced(fake.client()?, "sandboxd");
    leases.create(&PostParams::default(), &dead).await?;
    let pod = objects::pod_spec(&settings, &session(b).limits, None);
    let pool = objects::template_name(
        &pod,
        &objects::pod_spec(&settings, &Limits::default(), None),
    );
    let claim = objects::claim("sandboxd", &session(b), &format!("lease:{DEAD}"), &pool);
    let api: Api<DynamicObject> = Api::namespaced_with(
        fake.client()?,
        "sandboxd",
        &objects::resource("SandboxClaim"),
    );
    api.create(&PostParams::default(), &claim).await?;
    let other = claims_of(KubeRuntime::new(fake.client()?, settings));
    let mut bound = None;
    for _ in 0..600 {
        bound = other.find(b).await?.filter(|f| !f.handle.ends_with('/'));
        if bound.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bound = bound.expect("the dead replica's claim is bound");
    let manager = SessionManager::new(
        Arc::new(other.clone()),
        Limits::default(),
        SessionsConfig::default(),
        Arc::new(NoRecords),
    );
    assert_eq!(manager.reconcile().await?, vec![b.to_string()]);
    assert!(
        other.find(b).await?.is_none(),
        "the dead replica's claim is gone"
    );
    let pods: Api<Pod> = Api::namespaced(fake.client()?, "sandboxd");
    let b_pod = bound.handle.split('/').nth(1).unwrap_or_default();
    assert!(pods.get_opt(b_pod).await?.is_none(), "and its pod");
    let kept = other
        .find(a)
        .await?
        .expect("the live replica's claim stays");
    live.remove(&kept.handle).await?;
    live_pods.release_lease().await;
    Ok(())
}
