//! /mcp on `sandboxd serve` inside the users' quotas (issue 20, points 2, 5 and 8), against
//! a real serve, engine and image, with raw JSON-RPC and the official Python MCP SDK: an
//! MCP sandbox is a session of its user (their quota, their ceilings, /v1/me, /v1/sessions),
//! stateless sandboxes are owned by their user, removing a user removes their MCP sandboxes
//! at once, rows end with their sandboxes, and DELETE /mcp of a session the caller does not
//! have is a 404.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common as common;
use crate::serve;

#[path = "mcp_quota/client.rs"]
pub mod client;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use client::{Cleanup, Mcp, gone, inspect, mcp_containers, mcp_owner, me, sessions, wait_until};
use serve::{Api, Env, code};

#[tokio::test]
async fn an_mcp_sandbox_is_a_session_of_its_user_with_their_quota_and_ceilings() {
    let env = Env::new("idle_timeout_secs = 600").await;
    let key = env.add_user("ann", &["--sessions", "1", "--memory-mb", "256"]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let mut cleanup = Cleanup(Vec::new());

    // The official SDK, stateless (its default against this server), keeps its sandbox open.
    let out = tokio::process::Command::new(common::python())
        .args([
            common::script("client_sdk.py"),
            serve.url("/mcp"),
            key.clone(),
            "auto-keep".into(),
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "client_sdk.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        sdk["bash"]
            .as_str()
            .unwrap()
            .starts_with("hello-from-python"),
        "{sdk}"
    );
    let containers = mcp_containers(&env, &api).await;
    cleanup.0.extend(containers.clone());
    assert_eq!(
        containers.len(),
        1,
        "the SDK's sandbox is one session of ann's"
    );

    // Her ceiling, not the admin's default of 1 GiB.
    let memory = inspect(&containers[0], "{{.HostConfig.Memory}}");
    assert_eq!(
        memory,
        (256u64 << 20).to_string(),
        "the container's memory limit"
    );
    let listed = sessions(&api).await;
    assert_eq!(listed[0]["kind"], "mcp", "{listed:?}");
    assert_eq!(listed[0]["limits"]["memory_mb"], 256, "{listed:?}");
    let mine = me(&api).await;
    assert_eq!(mine["usage"]["active_sessions"], 1, "{mine}");
    assert_eq!(mine["usage"]["active_mcp_sessions"], 1, "{mine}");

    // Her quota of 1 is in use: no second session through the API or through /mcp.
    let (s, v) = api
        .json(Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!(code(&v), "quota_exceeded", "{s} {v}");
    let second = Mcp::open(&serve, &key).await;
    let (err, text) = second.call("bash", json!({"command": "true"})).await;
    assert!(err, "a second sandbox beyond the quota: {text}");
    assert!(
        text.contains("quota of 1 session") && text.contains("end one"),
        "the refusal says what to do: {text}"
    );
    let stateless = Mcp::stateless(&serve, &key);
    let (err, text) = stateless.call("sandbox_create", json!({})).await;
    assert!(err && text.contains("quota of 1 session"), "{text}");

    // The MCP session is not an API session; DELETE ends it and frees the place.
    let id = listed[0]["id"].as_str().unwrap().to_string();
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
    let (s, v) = api
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204, "{v}");
    wait_until(
        "the deleted MCP sandbox's container goes",
        Duration::from_secs(30),
        async || gone(&containers).await,
    )
    .await;
    assert_eq!(me(&api).await["usage"]["active_sessions"], 0);

    // Now the waiting MCP session gets its sandbox, with the same ceiling.
    second.bash("echo second", None).await;
    let containers = mcp_containers(&env, &api).await;
    cleanup.0.extend(containers.clone());
    assert_eq!(containers.len(), 1);
    assert_eq!(
        inspect(&containers[0], "{{.HostConfig.Memory}}"),
        (256u64 << 20).to_string()
    );
    assert_eq!(second.delete(None).await, 202);
    wait_until(
        "the closed session's container goes",
        Duration::from_secs(30),
        async || gone(&containers).await,
    )
    .await;
    wait_until(
        "the closed session's row ends",
        Duration::from_secs(30),
        async || me(&api).await["usage"]["active_sessions"] == 0,
    )
    .await;
}

#[tokio::test]
async fn stateless_sandboxes_are_owned_by_their_user_and_one_users_cap_leaves_the_other_alone() {
    // No warm pool: a claimed warm sandbox keeps the pool's owner label (labels cannot
    // change), and this test reads the owner from the label.
    let env = Env::new("idle_timeout_secs = 600\nmax_per_owner = 1\n[pool]\nsize = 0").await;
    let root = env.add_user("root", &["--admin"]);
    let bo_key = env.add_user("bo", &[]);
    let cy_key = env.add_user("cy", &[]);
    let serve = env.start();
    let (bo, cy) = (Api::new(&serve, &bo_key), Api::new(&serve, &cy_key));
    let (bo_mcp, cy_mcp) = (
        Mcp::stateless(&serve, &bo_key),
        Mcp::stateless(&serve, &cy_key),
    );
    let mut cleanup = Cleanup(Vec::new());

    let bo_id = bo_mcp.create().await;
    cleanup.0.extend(mcp_containers(&env, &bo).await);
    // Bo's cap of one sandbox is full...
    let (err, text) = bo_mcp.call("sandbox_create", json!({})).await;
    assert!(err && text.contains("already hold 1"), "{text}");
    // ...which is Bo's alone: Cy still gets one.
    let cy_id = cy_mcp.create().await;
    cleanup.0.extend(mcp_containers(&env, &cy).await);
    assert!(cy_mcp.bash("echo cy", Some(&cy_id)).await.contains("cy"));
    assert!(bo_mcp.bash("echo bo", Some(&bo_id)).await.contains("bo"));
    // Neither can use the other's id.
    let (err, _) = bo_mcp
        .call("bash", json!({"command": "true", "sandbox_id": cy_id}))
        .await;
    assert!(err);

    let owners: Vec<String> = cleanup
        .0
        .iter()
        .map(|c| inspect(c, "{{index .Config.Labels \"sandboxd.owner\"}}"))
        .collect();
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert_ne!(owners[0], owners[1], "each user owns their own sandboxes");
    assert!(
        owners.iter().all(|o| o.starts_with("serve-mcp")),
        "{owners:?}"
    );
    for api in [&bo, &cy] {
        assert_eq!(me(api).await["usage"]["active_mcp_sessions"], 1);
    }
    // The admin's view (the admin page's tables) has them too.
    let admin = Api::new(&serve, &root);
    let (_, users) = admin.json(Method::GET, "/v1/users", None).await;
    let bo_view = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "bo")
        .unwrap()
        .clone();
    assert_eq!(bo_view["usage"]["active_sessions"], 1, "{bo_view}");
    assert_eq!(bo_view["usage"]["active_mcp_sessions"], 1, "{bo_view}");
    let all = sessions(&admin).await;
    assert_eq!(
        all.iter().filter(|s| s["kind"] == "mcp").count(),
        2,
        "{all:?}"
    );

    let (err, text) = bo_mcp
        .call("sandbox_close", json!({"sandbox_id": bo_id}))
        .await;
    assert!(!err, "{text}");
    let (err, text) = cy_mcp
        .call("sandbox_close", json!({"sandbox_id": cy_id}))
        .await;
    assert!(!err, "{text}");
    let containers = cleanup.0.clone();
    wait_until("closed sandboxes go", Duration::from_secs(30), async || {
        gone(&containers).await
    })
    .await;
    assert_eq!(me(&bo).await["usage"]["active_sessions"], 0);
}

#[tokio::test]
async fn removing_a_user_removes_their_mcp_sessions_and_sandboxes_at_once() {
    let env = Env::new("idle_timeout_secs = 600\n[pool]\nsize = 0").await;
    let root = env.add_user("root", &["--admin"]);
    let dee_key = env.add_user("dee", &[]);
    let eve_key = env.add_user("eve", &[]);
    let serve = env.start();
    let admin = Api::new(&serve, &root);
    let mut cleanup = Cleanup(Vec::new());

    // Dee holds a session's sandbox and a stateless one (both hers: her owner label; no warm
    // pool, whose sandboxes keep the pool's label when claimed).
    let ids = env.user_ids();
    let (dee_id, eve_id) = (&ids[1], &ids[2]);
    let session = Mcp::open(&serve, &dee_key).await;
    session.bash("true", None).await;
    Mcp::stateless(&serve, &dee_key).create().await;
    let dee_owner = mcp_owner(dee_id);
    let dee_containers = serve::containers_of(&dee_owner);
    cleanup.0.extend(dee_containers.clone());
    cleanup
        .0
        .extend(mcp_containers(&env, &Api::new(&serve, &dee_key)).await);
    assert!(!dee_containers.is_empty(), "dee's MCP containers");

    let (s, v) = admin.json(Method::DELETE, "/v1/users/dee", None).await;
    assert_eq!(s, 204, "{v}");
    wait_until(
        "dee's MCP containers go with her",
        Duration::from_secs(20),
        async || serve::containers_of(&dee_owner).is_empty(),
    )
    .await;

    // Eve, removed by the CLI (another process): serve's upkeep closes hers.
    Mcp::open(&serve, &eve_key).await.bash("true", None).await;
    let eve_owner = mcp_owner(eve_id);
    cleanup
        .0
        .extend(mcp_containers(&env, &Api::new(&serve, &eve_key)).await);
    let eve_containers = serve::containers_of(&eve_owner);
    cleanup.0.extend(eve_containers.clone());
    assert_eq!(eve_containers.len(), 1);
    let out = env.cmd().args(["users", "rm", "eve"]).output().unwrap();
    assert!(out.status.success());
    wait_until(
        "eve's MCP container goes with her",
        Duration::from_secs(30),
        async || serve::containers_of(&eve_owner).is_empty(),
    )
    .await;
    // Nothing of theirs is left running in the store either.
    let (s, v) = admin.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["sessions"], json!([]), "{v}");
}

#[tokio::test]
async fn delete_mcp_with_another_users_or_an_unknown_session_id_is_404() {
    let env = Env::new("idle_timeout_secs = 600").await;
    let fay_key = env.add_user("fay", &[]);
    let gus_key = env.add_user("gus", &[]);
    let serve = env.start();
    let mut cleanup = Cleanup(Vec::new());
    let fay = Mcp::open(&serve, &fay_key).await;
    let host = fay.bash("hostname", None).await;
    cleanup
        .0
        .extend(mcp_containers(&env, &Api::new(&serve, &fay_key)).await);

    let gus = Mcp::open(&serve, &gus_key).await;
    assert_eq!(
        gus.delete(fay.sid.as_deref()).await,
        404,
        "another user's id"
    );
    assert_eq!(
        gus.delete(Some("00000000-0000-0000-0000-000000000000"))
            .await,
        404,
        "an unknown id"
    );
    // Fay's session and its sandbox are untouched.
    assert_eq!(fay.bash("hostname", None).await, host);
    assert_eq!(fay.delete(None).await, 202);
    assert_eq!(fay.delete(None).await, 404, "a closed session is unknown");
    assert_eq!(gus.delete(None).await, 202);
}

#[tokio::test]
async fn mcp_rows_end_with_their_sandbox_when_idle_and_at_a_restart() {
    let env = Env::new("idle_timeout_secs = 2").await;
    let key = env.add_user("hal", &["--sessions", "1"]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let mut cleanup = Cleanup(Vec::new());

    let m = Mcp::open(&serve, &key).await;
    m.bash("true", None).await;
    let containers = mcp_containers(&env, &api).await;
    cleanup.0.extend(containers.clone());
    assert_eq!(containers.len(), 1);
    // The reaper takes the idle sandbox; its row ends with it and the place is free.
    wait_until(
        "the idle MCP sandbox goes",
        Duration::from_secs(60),
        async || gone(&containers).await,
    )
    .await;
    wait_until("its row ends", Duration::from_secs(30), async || {
        me(&api).await["usage"]["active_sessions"] == 0
    })
    .await;
    let ended = {
        let (_, v) = api
            .json(Method::GET, "/v1/sessions?include_ended=true", None)
            .await;
        v["sessions"][0].clone()
    };
    assert_eq!(
        (ended["kind"].as_str(), ended["state"].as_str()),
        (Some("mcp"), Some("ended")),
        "{ended}"
    );

    // The next call gets a new sandbox; a kill -9 leaves its row, which the next start ends.
    m.bash("true", None).await;
    let containers = mcp_containers(&env, &api).await;
    cleanup.0.extend(containers.clone());
    assert_eq!(containers.len(), 1);
    serve.kill9();
    let serve = env.start();
    let api = Api::new(&serve, &key);
    assert_eq!(me(&api).await["usage"]["active_sessions"], 0);
    assert!(sessions(&api).await.is_empty());
    wait_until(
        "the dead serve's MCP container goes",
        Duration::from_secs(30),
        async || gone(&containers).await,
    )
    .await;
}
