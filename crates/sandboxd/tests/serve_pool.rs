//! `sandboxd serve` with a warm pool, on the real engine: a session created through
//! POST /v1/sessions is a claim of a sandbox the pool made before the request, lowered to the
//! limits asked for, with an empty /workspace; after `kill -9` the next start re-adopts the
//! claimed sandbox from the store and removes the dead process's warm ones; a deleted
//! session's container is gone, not back in the pool; SIGTERM removes the warm sandboxes.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, container_of, sessions_created_by};

/// What `serve` logs (at debug) when a refill round made sandboxes.
const POOL_LOG: &str = "warn,sandboxd::access=info,sandboxd_core::sandbox::pool=debug";

/// The session labels of the running warm-pool containers of `scope`.
fn pooled_running(scope: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "--filter",
            &format!("label=sandboxd.owner={scope}"),
            "--filter",
            "label=sandboxd.pool=true",
            "--format",
            "{{.Label \"sandboxd.session\"}}",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn inspect(container: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", container])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

#[tokio::test]
async fn api_sessions_claim_from_the_pool_and_a_crash_leaves_no_pooled_container() {
    let env = Env::new("[pool]\nsize = 2\nrefill_interval_secs = 1\n").await;
    let key = env.add_user("pia", &[]);
    let scope = env.pool_owner();
    let mut serve = env.start_logging(POOL_LOG);
    // The first refill round made both warm sandboxes (shell and file helper up).
    serve.wait_for_log("added: 2");
    let warm = pooled_running(&scope);
    assert_eq!(warm.len(), 2, "{warm:?}");

    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"limits": {"memory_mb": 256, "cpus": 0.5, "pids": 64}})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let rt = env.runtime_id(&id).await;
    let container = env.container(&id).await;
    assert!(
        warm.contains(&rt),
        "the session's container {rt} is one the pool made before the request ({warm:?})"
    );
    let c = inspect(&container);
    assert_eq!(c["Config"]["Labels"]["sandboxd.pool"], "true");
    assert!(
        c["Config"]["Labels"].get("sandboxd.owner").unwrap() == &json!(scope),
        "a warm sandbox's owner label is the pool scope, never a user: {}",
        c["Config"]["Labels"]
    );
    // The limits asked for, applied to the running container at claim time.
    assert_eq!(c["HostConfig"]["Memory"], 256u64 << 20);
    assert_eq!(c["HostConfig"]["NanoCpus"], 500_000_000u64);
    assert_eq!(c["HostConfig"]["PidsLimit"], 64);
    assert_eq!(v["limits"]["memory_mb"], 256, "{v}");

    let out = api.exec(&id, "ls -A /workspace; echo $((6*7))").await;
    assert_eq!(
        out["stdout"], "42\n",
        "an empty /workspace, a working shell: {out}"
    );
    api.exec(&id, "echo from the pool > /workspace/note.txt")
        .await;

    // kill -9, then a new start: the claimed sandbox is adopted from the store, every other
    // container the dead process made (its warm ones, the refill's) is removed.
    let first = serve.pid();
    serve.kill9();
    let mut serve = env.start_logging(POOL_LOG);
    let api = Api::new(&serve, &key);
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{id}/files/content?path=note.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "from the pool\n");
    let out = api.exec(&id, "echo back").await;
    assert_eq!(out["stdout"], "back\n", "{out}");
    let (_, v) = api
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(v["limits"]["memory_mb"], 256, "{v}");
    assert_eq!(inspect(&container)["HostConfig"]["Memory"], 256u64 << 20);
    let user = env.user_ids()[0].clone();
    let owners = [scope.clone(), format!("serve:{user}")];
    serve::wait_for_leftovers(&owners, first, std::slice::from_ref(&rt)).await;

    // Another user cannot reach it by the runtime id or the API id.
    let other = env.add_user("quin", &[]);
    let (s, _) = Api::new(&serve, &other)
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 404);

    // Ending the session destroys its container; the pool makes new ones, never reuses it.
    let (s, v) = api
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204, "{v}");
    assert!(!container_of(&rt, false), "the claimed container is gone");
    serve.wait_for_log("added: 2");
    let second = serve.pid();
    let now_warm = pooled_running(&scope);
    assert!(!now_warm.contains(&rt), "{now_warm:?}");
    assert_eq!(sessions_created_by(&scope, second).len(), 2);

    // SIGTERM closes the pool: its warm sandboxes are removed.
    serve.sigterm(Duration::from_secs(30));
    assert!(
        sessions_created_by(&scope, second).is_empty(),
        "a stopped serve leaves no warm sandbox"
    );
}
