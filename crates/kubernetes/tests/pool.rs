//! The core's warm pool, unchanged, on the Kubernetes backend against the fake API server:
//! warm pods are made ahead, a session claims one (its id is the warm pod's) with a single
//! merge patch that marks the pod claimed and by whom, the claimed pod runs the session's
//! commands and reports its memory use, the refill makes a fresh pod (never the claimed one
//! back), and closing the pool removes the free ones.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use sandboxd_core::config::{LimitRequest, Limits, PoolConfig, SessionsConfig};
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::runtime::Runtime;
use sandboxd_core::sandbox::{CreateOptions, Owner, SessionManager, ShellOptions};
use sandboxd_kubernetes::meta::{CLAIMED, CLAIMED_BY};

use crate::conformance::runtime;
use crate::fake::FakeApi;

async fn pod(fake: &FakeApi, rt: &dyn Runtime, session: &str) -> anyhow::Result<Pod> {
    let found = rt.find(session).await?.expect("the session's pod");
    let api: Api<Pod> = Api::namespaced(fake.client()?, "sandboxd");
    Ok(api.get(&found.handle).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_claims_a_warm_pod_with_one_relabel_and_the_pool_refills() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let rt = Arc::new(runtime(&fake).await);
    let limits = Limits {
        memory_mb: 256,
        ..Limits::default()
    };
    let pool = PoolConfig {
        size: 1,
        refill_delay_ms: 0,
        ..PoolConfig::default()
    };
    let m = SessionManager::with_pool(
        rt.clone(),
        limits,
        SessionsConfig::default(),
        pool,
        Arc::new(NoRecords),
    );
    assert_eq!(m.refill_pool().await.added, 1);
    let warm = m.pool_sessions();
    let free = pod(&fake, rt.as_ref(), &warm[0]).await?;
    let labels = free.metadata.labels.clone().unwrap_or_default();
    assert!(!labels.contains_key(CLAIMED), "{labels:?}");

    let alice = Owner::new("alice@example.com")?;
    let s = m
        .create(&alice, &LimitRequest::default(), CreateOptions::default())
        .await?;
    assert_eq!(s.id, warm[0], "the session is the warm pod");
    let claimed = pod(&fake, rt.as_ref(), &s.id).await?;
    let labels = claimed.metadata.labels.clone().unwrap_or_default();
    let notes = claimed.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(labels.get(CLAIMED).map(String::as_str), Some("true"));
    assert_eq!(
        notes.get(CLAIMED_BY).map(String::as_str),
        Some("alice@example.com")
    );
    // What the pod recorded at creation is unchanged: a warm pod has no owner.
    let found = rt.find(&s.id).await?.expect("found");
    assert!(found.pooled && found.owner.is_none(), "{found:?}");
    let out = s
        .sandbox
        .shell("echo warm", ShellOptions::default())
        .await?;
    assert_eq!(out.stdout_lossy(), "warm\n");
    // Its memory use is read in the pod (cgroup files through exec) and counts what the
    // memory-backed /workspace holds.
    let before = rt.memory_usage(&s.handle).await?.expect("the pod says");
    let fill = s
        .sandbox
        .shell(
            "head -c 32M /dev/zero > /workspace/fill",
            ShellOptions::default(),
        )
        .await?;
    assert_eq!(fill.exit_code, Some(0));
    let after = rt.memory_usage(&s.handle).await?.expect("the pod says");
    assert!(
        after >= before + (24 << 20) && after <= 256 << 20,
        "{before} → {after}"
    );

    assert_eq!(m.refill_pool().await.added, 1);
    let next = m.pool_sessions();
    assert_eq!(next.len(), 1);
    assert_ne!(next[0], s.id, "a claimed pod never goes back to the pool");
    m.close_pool().await;
    m.remove(&alice, &s.id).await?;
    assert!(rt.list().await?.is_empty(), "{:?}", rt.list().await?);
    Ok(())
}
