//! Replica liveness through Leases, against the fake API server: a process's Lease appears
//! when it starts holding it, is renewed every third of its duration, is written again when
//! someone deletes it and is gone after a graceful stop; the reconciler of another replica
//! (the core's `SessionManager::reconcile`, unchanged) removes the pod of a replica whose
//! Lease ran out and keeps a live replica's; a pod whose creator's Lease does not exist is
//! kept while it is younger than a lease duration plus the grace, and removed after. The
//! expiry rule itself is checked exactly, on an injected "now", in src/lease.rs. Only the
//! renewal test waits on real time (a 3 s Lease is renewed each second).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use sandboxd_core::config::{Limits, SessionsConfig};
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Owner, SessionManager};
use sandboxd_kubernetes::{KubeRuntime, PodSettings, spec};

use crate::conformance::image;
use crate::fake::FakeApi;

fn leases(fake: &FakeApi) -> Api<Lease> {
    Api::namespaced(fake.client().unwrap(), "sandboxd")
}

async fn renewed(api: &Api<Lease>, name: &str) -> Option<Timestamp> {
    let lease = api.get_opt(name).await.ok()??;
    Some(lease.spec?.renew_time?.0)
}

/// Polls every 50 ms, for up to 3 s, until the Lease exists with a `renewTime` after `after`.
async fn renewed_after(api: &Api<Lease>, name: &str, after: Option<Timestamp>) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        if renewed(api, name)
            .await
            .is_some_and(|t| after.is_none_or(|a| t > a))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_lease_appears_is_renewed_and_goes_at_shutdown() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let settings = PodSettings {
        lease_secs: 3,
        ..PodSettings::default()
    };
    let rt = KubeRuntime::new(fake.client()?, settings.clone());
    let name = rt.lease_name().to_string();
    let api = leases(&fake);
    assert!(api.get_opt(&name).await?.is_none(), "no Lease before");

    rt.hold_lease().await?;
    let lease = api.get(&name).await?;
    let s = lease.spec.clone().expect("a spec");
    assert_eq!(s.lease_duration_seconds, Some(3));
    let holder = s.holder_identity.clone().unwrap_or_default();
    assert!(
        holder.contains(&format!("/{}:", std::process::id())),
        "{holder}"
    );
    let first = s.renew_time.expect("renewTime").0;
    // Renewed a third of the way through (1 s), well before it runs out.
    assert!(
        renewed_after(&api, &name, Some(first)).await,
        "renewTime never moved past {first}"
    );
    // Another replica sees it alive.
    let other = KubeRuntime::new(fake.client()?, settings);
    let creator = format!("lease:{name}");
    assert!(other.creator_alive(&creator).await);

    // A Lease someone deletes is written again by the next renewal.
    api.delete(&name, &Default::default()).await?;
    assert!(
        renewed_after(&api, &name, None).await,
        "the deleted Lease was not written again"
    );

    // A graceful stop deletes it, and nothing writes it again.
    rt.release_lease().await;
    assert!(api.get_opt(&name).await?.is_none(), "deleted at shutdown");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(api.get_opt(&name).await?.is_none(), "the renewal stopped");
    Ok(())
}

fn session(id: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: id.into(),
        owner: Some(Owner::new("alice@example.com").unwrap()),
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

fn id(n: u8) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{n:02x}{nanos:08x}ee")
}

fn manager(rt: KubeRuntime) -> Arc<SessionManager> {
    SessionManager::new(
        Arc::new(rt),
        Limits::default(),
        SessionsConfig::default(),
        Arc::new(NoRecords),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_removes_pods_of_expired_leases_and_keeps_live_ones() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let settings = PodSettings {
        image: image().await,
        ..PodSettings::default()
    };
    // A live replica (its Lease lasts an hour, so a later clock below still finds it live)
    // makes a pod the usual way.
    let live = KubeRuntime::new(
        fake.client()?,
        PodSettings {
            lease_secs: 3600,
            ..settings.clone()
        },
    );
    let (a, b, c) = (id(1), id(2), id(3));
    live.create(&session(&a)).await?;
    // A replica that crashed two minutes ago: its Lease's last renewal, and its pod.
    let old = Timestamp::try_from(SystemTime::now() - Duration::from_secs(120))?;
    let dead = Lease {
        metadata: ObjectMeta {
            name: Some("sandboxd-replica-dead00000000".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("gone/1:1".into()),
            lease_duration_seconds: Some(30),
            renew_time: Some(MicroTime(old)),
            ..LeaseSpec::default()
        }),
    };
    leases(&fake).create(&PostParams::default(), &dead).await?;
    let pods: Api<Pod> = Api::namespaced(fake.client()?, "sandboxd");
    let made = |id: &str, creator: &str| spec::pod(&settings, &session(id), creator);
    pods.create(
        &PostParams::default(),
        &made(&b, "lease:sandboxd-replica-dead00000000"),
    )
    .await?;
    // A pod whose creator's Lease never existed here (deleted at its shutdown, say).
    pods.create(
        &PostParams::default(),
        &made(&c, "lease:sandboxd-replica-never0000000"),
    )
    .await?;

    // Another replica reconciles: only the expired Lease's pod goes; the pod without a
    // Lease is younger than a lease duration and stays, as the live replica's does.
    let other = KubeRuntime::new(fake.client()?, settings.clone());
    let found = |rt: &KubeRuntime, id: &str| {
        let (rt, id) = (rt.clone(), id.to_string());
        async move { rt.find(&id).await.unwrap().is_some() }
    };
    assert_eq!(manager(other.clone()).reconcile().await?, vec![b.clone()]);
    assert!(!found(&other, &b).await, "the dead replica's pod is gone");
    assert!(found(&other, &a).await && found(&other, &c).await);

    // Past a lease duration plus the grace after that pod was made, its creator is dead;
    // the live replica's Lease (an hour) still holds.
    let later = KubeRuntime::new(fake.client()?, settings)
        .with_clock(Arc::new(|| SystemTime::now() + Duration::from_secs(36)));
    assert_eq!(manager(later.clone()).reconcile().await?, vec![c.clone()]);
    assert!(!found(&other, &c).await && found(&other, &a).await);
    assert!(
        live.creator_alive(&format!("lease:{}", live.lease_name()))
            .await
    );
    live.remove(&live.find(&a).await?.expect("a's pod").handle)
        .await?;
    live.release_lease().await;
    Ok(())
}
