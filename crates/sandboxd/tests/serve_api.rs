//! `sandboxd serve` as a real process on loopback, on the real engine and image: ownership
//! (another user's objects are 404 on every route), listing, bad input, quotas, files and
//! tar archives (hostile ones refused with nothing written), tools, health, /mcp per user.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::tar_support;

use reqwest::Method;
use serde_json::json;

use serve::{Api, Env, code};

#[tokio::test]
async fn another_users_objects_are_404_on_every_route_and_lists_are_per_user() {
    let env = Env::new("").await;
    let admin_key = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &[]);
    let carol_key = env.add_user("carol", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let carol = Api::new(&serve, &carol_key);
    let admin = Api::new(&serve, &admin_key);

    let id = bob.session().await;
    let carols = carol.session().await;
    bob.exec(&id, "echo secret > /workspace/s.txt").await;

    let routes: Vec<(Method, String, Option<serde_json::Value>)> = vec![
        (Method::GET, format!("/v1/sessions/{id}"), None),
        (
            Method::POST,
            format!("/v1/sessions/{id}/exec"),
            Some(json!({"command": "id"})),
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/tools/bash"),
            Some(json!({"command": "id"})),
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/files?path=/workspace"),
            None,
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/files/content?path=s.txt"),
            None,
        ),
        (Method::GET, format!("/v1/sessions/{id}/archive"), None),
        (Method::DELETE, format!("/v1/sessions/{id}"), None),
    ];
    for (m, path, body) in &routes {
        let (s, v) = carol.json(m.clone(), path, body.clone()).await;
        assert_eq!((s, code(&v)), (404, "not_found"), "{m} {path}: {v}");
    }
    for path in [
        format!("/v1/sessions/{id}/files/content?path=x"),
        format!("/v1/sessions/{id}/archive"),
    ] {
        let r = carol
            .req(Method::PUT, &path)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "PUT {path}");
    }
    // Not even existence leaks: a made-up id gets the same answer.
    let (s, ghost) = carol.json(Method::GET, "/v1/sessions/ses_nope", None).await;
    assert_eq!(s, 404);
    assert_eq!(code(&ghost), "not_found");
    // Carol's requests did nothing to it.
    let out = bob.exec(&id, "cat /workspace/s.txt").await;
    assert_eq!(out["stdout"], "secret\n");

    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, bl) = bob.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(ids(&bl), vec![id.clone()]);
    let (_, cl) = carol.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(ids(&cl), vec![carols.clone()]);
    let (_, al) = admin.json(Method::GET, "/v1/sessions", None).await;
    let all = ids(&al);
    assert!(all.contains(&id) && all.contains(&carols), "{al}");
    let (s, _) = admin
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 200, "an admin sees every session");
    let (s, users) = admin.json(Method::GET, "/v1/users", None).await;
    assert_eq!(s, 200);
    let bob_row = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "bob")
        .unwrap();
    assert_eq!(bob_row["usage"]["active_sessions"], 1, "{users}");
    let (s, _) = bob.json(Method::GET, "/v1/users", None).await;
    assert_eq!(s, 404, "the user list is an admin's");

    // No key, a wrong key: 401 everywhere but the health checks.
    let anon = Api::new(&serve, "sbx_wrong");
    for path in ["/v1/sessions", "/v1/openapi.json", "/v1/tools", "/mcp"] {
        let (s, v) = anon.json(Method::GET, path, None).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "{path}");
    }
    let r = reqwest::get(serve.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), 200);
    let r = reqwest::get(serve.url("/readyz")).await.unwrap();
    let ready: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ready["status"], "ok", "{ready}");

    // Paging: limit 1 then the cursor.
    admin.session().await;
    let (_, p1) = admin.json(Method::GET, "/v1/sessions?limit=1", None).await;
    assert_eq!(p1["sessions"].as_array().unwrap().len(), 1);
    let cursor = p1["next_cursor"].as_str().expect("a next page").to_string();
    let (_, p2) = admin
        .json(
            Method::GET,
            &format!("/v1/sessions?limit=1&cursor={cursor}"),
            None,
        )
        .await;
    assert_ne!(p1["sessions"][0]["id"], p2["sessions"][0]["id"]);

    // Bob deletes his: it ends (its container goes; issue 20 point 6: the session and its
    // history stay, ended, until the retention or DELETE …/history).
    let (s, _) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    let (s, v) = bob
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("ended")), "{v}");
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named() {
    let env = Env::new("").await;
    let key = env.add_user("dana", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let exec = format!("/v1/sessions/{id}/exec");

    let raw = |body: &'static str| {
        api.req(Method::POST, &exec)
            .header("content-type", "application/json")
            .body(body)
    };
    let cases = [
        ("{\"command\": ", "invalid_request", "JSON"),
        (
            "{\"command\": \"id\", \"shell\": \"zsh\"}",
            "invalid_request",
            "shell",
        ),
        ("{\"command\": 5}", "invalid_request", "command"),
        (
            "{\"command\": \"id\", \"timeout\": \"soon\"}",
            "invalid_request",
            "timeout",
        ),
        (
            "{\"command\": \"id\", \"timeout\": 100000}",
            "invalid_request",
            "timeout",
        ),
    ];
    for (body, want, field) in cases {
        let r = raw(body).send().await.unwrap();
        let status = r.status().as_u16();
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!((status, code(&v)), (400, want), "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(field),
            "{body}: the message names {field}: {msg}"
        );
    }
    let r = api
        .req(Method::POST, &exec)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415, "no JSON content type");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"limits": {"memory_mb": "big"}})),
        )
        .await;
    assert_eq!(s, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("limits") && msg.contains("memory_mb"), "{v}");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"metadata": {"bad key": "x"}})),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");

    // Over the JSON limit (64 KiB in this config): 413.
    let big = json!({"command": "x".repeat(80 * 1024)});
    let (s, v) = api.json(Method::POST, &exec, Some(big)).await;
    assert_eq!((s, code(&v)), (413, "payload_too_large"), "{v}");
    // Uploads have their own, larger limit (4 MiB here): 1 MiB passes, 5 MiB does not.
    let put = |path: &str, body: Vec<u8>| api.req(Method::PUT, path).body(body).send();
    let r = put(
        &format!("/v1/sessions/{id}/files/content?path=big.bin"),
        vec![7u8; 1 << 20],
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // On its own connection: the server answers 413 without reading the body and closes it.
    let r = reqwest::Client::new()
        .put(serve.url(&format!("/v1/sessions/{id}/files/content?path=huge.bin")))
        .bearer_auth(&key)
        .body(vec![7u8; 5 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);

    // Writes outside /workspace are refused before the sandbox is asked; reads may leave it
    // (the file, or a 404: serve_v1files.rs has the rest).
    for (p, read) in [
        ("/etc/passwd", 200),
        ("../etc/passwd", 200),
        ("/workspace/../tmp/x", 404),
        ("/tmp/x", 404),
    ] {
        let url = format!("/v1/sessions/{id}/files/content?path={}", urlencode(p));
        let r = api.req(Method::GET, &url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), read, "GET {p}");
        let r = put(&url, b"x".to_vec()).await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "PUT {p}");
    }

    // Hostile archives: refused, and nothing at all is written.
    use tar_support::Tar;
    let before = api.exec(&id, "find /workspace | sort").await["stdout"].clone();
    let hostile = [
        (
            "absolute",
            Tar::new()
                .file("ok.txt", b"x")
                .file("/abs.txt", b"x")
                .finish(),
        ),
        (
            "dotdot",
            Tar::new()
                .file("ok.txt", b"x")
                .file("../up.txt", b"x")
                .finish(),
        ),
        (
            "symlink out",
            Tar::new()
                .symlink("link", "../../etc")
                .file("ok.txt", b"x")
                .finish(),
        ),
        (
            "through a symlink",
            Tar::new().symlink("l", "sub").file("l/x", b"x").finish(),
        ),
    ];
    for (what, tar) in hostile {
        let r = put(&format!("/v1/sessions/{id}/archive"), tar)
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!((status, code(&v)), (400, "invalid_request"), "{what}: {v}");
    }
    let after = api.exec(&id, "find /workspace | sort").await["stdout"].clone();
    assert_eq!(before, after, "a refused archive wrote something");
    let r = put(
        &format!("/v1/sessions/{id}/archive?path=/etc"),
        Tar::new().file("a", b"x").finish(),
    )
    .await
    .unwrap();
    assert_eq!(
        r.status().as_u16(),
        400,
        "an archive may only go inside /workspace"
    );

    // Unknown routes and methods answer in the API's shape too.
    let (s, v) = api.json(Method::GET, "/v1/nope", None).await;
    assert_eq!((s, code(&v)), (404, "not_found"));
    let (s, v) = api.json(Method::PATCH, "/v1/sessions", None).await;
    assert_eq!((s, code(&v)), (405, "method_not_allowed"));
    // A name nobody configured in Host is refused (DNS-rebinding guard).
    let r = api
        .req(Method::GET, "/v1/sessions")
        .header("host", "evil.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn quotas_answer_429_naming_the_quota() {
    let env = Env::new("[quotas]\nmemory_mb = 512\n").await;
    let key = env.add_user("erin", &["--sessions", "1"]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"limits": {"memory_mb": 1024}})),
        )
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "memory_mb");
    assert_eq!(v["error"]["limit"], "512");

    let (s, first) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"limits": {"memory_mb": 256}, "metadata": {"k": "v"}})),
        )
        .await;
    assert_eq!(s, 201, "{first}");
    assert_eq!(first["limits"]["memory_mb"], 256);
    let (s, v) = api
        .json(Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "sessions");
    assert_eq!(v["error"]["limit"], "1");
    let (_, me) = api.json(Method::GET, "/v1/me", None).await;
    assert_eq!(me["usage"]["active_sessions"], 1);
    assert_eq!(me["quota"]["ceiling"]["memory_mb"], 512);

    // A default session takes the user's ceiling, not the admin's limit.
    let id = first["id"].as_str().unwrap();
    let (s, _) = api
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    let (s, v) = api
        .json(Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!(s, 201, "deleting freed the quota: {v}");
    assert_eq!(v["limits"]["memory_mb"], 512);
}

#[tokio::test]
async fn files_archives_tools_and_the_persistent_shell() {
    let env = Env::new("").await;
    let key = env.add_user("fay", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;

    api.exec(&id, "cd /workspace && mkdir -p d && export GREETING=hello")
        .await;
    let out = api.exec(&id, "echo $GREETING from $(pwd); exit 3").await;
    assert_eq!(out["stdout"], "hello from /workspace\n", "{out}");
    assert_eq!(out["exit_code"], 3);
    let out = api.exec(&id, "echo still here").await;
    assert_eq!(
        out["stdout"], "still here\n",
        "the shell survives `exit`: {out}"
    );

    let r = api
        .req(
            Method::PUT,
            &format!("/v1/sessions/{id}/files/content?path=d/a.txt"),
        )
        .body("alpha\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{id}/files/content?path=/workspace/d/a.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "alpha\n");
    let (s, ls) = api
        .json(
            Method::GET,
            &format!("/v1/sessions/{id}/files?path=d"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(ls["entries"][0]["name"], "a.txt", "{ls}");

    let tar = tar_support::Tar::new()
        .dir("up")
        .file("up/b.txt", b"beta")
        .finish();
    let r = api
        .req(Method::PUT, &format!("/v1/sessions/{id}/archive"))
        .body(tar)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["entries"], 2, "{v}");
    assert_eq!(
        api.exec(&id, "cat /workspace/up/b.txt").await["stdout"],
        "beta"
    );

    let r = api
        .req(Method::GET, &format!("/v1/sessions/{id}/archive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let bytes = r.bytes().await.unwrap();
    let mut names: Vec<String> = tar::Archive::new(&bytes[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert!(names.iter().any(|n| n.ends_with("d/a.txt")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("up/b.txt")), "{names:?}");

    // Tools by name, with the agent's registry and its argument checks.
    let (s, tools) = api.json(Method::GET, "/v1/tools", None).await;
    assert_eq!(s, 200);
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"bash") && names.contains(&"str_replace_editor"),
        "{names:?}"
    );
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/str_replace_editor"),
            Some(json!({"command": "view", "path": "/workspace/d/a.txt"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["output"].as_str().unwrap().contains("alpha"), "{v}");
    // Every figure of a cell, in order; the first is also `base64_image` (as before).
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/python"),
            Some(json!({"code": "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.figure(figsize=(1 + i, 1)); plt.plot([0, i])\nNone"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let images: Vec<&str> = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert_eq!(images.len(), 3, "{}", v["output"]);
    assert_eq!(v["base64_image"], images[0]);
    use base64::Engine as _;
    let widths: Vec<u32> = images
        .iter()
        .map(|b| {
            let png = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
            assert!(png.starts_with(b"\x89PNG"), "a PNG");
            u32::from_be_bytes(png[16..20].try_into().unwrap())
        })
        .collect();
    assert!(
        widths[0] < widths[1] && widths[1] < widths[2],
        "in the order they were drawn: {widths:?}"
    );
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/bash"),
            Some(json!({"command": "echo no image"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["images"], json!([]));
    assert!(v["base64_image"].is_null());
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/bash"),
            Some(json!({"command": 1})),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/rm_rf"),
            Some(json!({})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
}

#[tokio::test]
async fn mcp_sessions_belong_to_the_user_whose_key_made_them() {
    let env = Env::new("").await;
    let gil = env.add_user("gil", &[]);
    let hal = env.add_user("hal", &[]);
    let serve = env.start();
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let post = |key: &str, body: &serde_json::Value, sid: Option<&str>| {
        let mut r = http
            .post(serve.url("/mcp"))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        if let Some(s) = sid {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        r.send()
    };
    let r = post(&gil, &init, None).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let notif = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = post(&gil, &notif, Some(&sid)).await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = post(&gil, &list, Some(&sid)).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.unwrap();
    assert!(body.contains("str_replace_editor"), "{body}");
    // Hal's key with Gil's session id: that session does not exist for Hal.
    let r = post(&hal, &list, Some(&sid)).await.unwrap();
    assert_eq!(r.status().as_u16(), 404, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_non_loopback_address_is_refused_while_no_user_exists() {
    let env = Env::new("").await;
    let out = env
        .cmd()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no user exists") && err.contains("users add"),
        "{err}"
    );
}

#[tokio::test]
async fn removing_or_rotating_a_user_revokes_the_key_and_ends_their_sessions() {
    let env = Env::new("").await;
    let kim = env.add_user("kim", &[]);
    let lou = env.add_user("lou", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &kim);
    let kim_session = api.session().await;
    let kim_rt = env.runtime_id(&kim_session).await;
    assert!(serve::container_of(&kim_rt, true));

    // Rotation: the old key stops working at once, the new one works.
    let out = env.cmd().args(["users", "rotate", "lou"]).output().unwrap();
    assert!(out.status.success());
    let new_lou = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (s, _) = Api::new(&serve, &lou)
        .json(Method::GET, "/v1/me", None)
        .await;
    assert_eq!(s, 401);
    let (s, me) = Api::new(&serve, &new_lou)
        .json(Method::GET, "/v1/me", None)
        .await;
    assert_eq!((s, me["name"].as_str()), (200, Some("lou")));

    // Removal while serve runs: 401 at once, the container goes within the upkeep interval.
    let out = env.cmd().args(["users", "rm", "kim"]).output().unwrap();
    assert!(out.status.success());
    let (s, _) = api.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(s, 401);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while serve::container_of(&kim_rt, false) {
        assert!(
            std::time::Instant::now() < deadline,
            "kim's container is still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let list = env.cmd().args(["users", "list"]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("lou") && !text.contains("kim"), "{text}");
    assert!(!text.contains(&new_lou), "keys are never listed");
}
