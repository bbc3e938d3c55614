//! A session's egress policy through a real `serve` and the real CLI (issue 24): set at
//! create, shown and changed by GET/PUT /v1/sessions/{id}/egress within the admin's widest
//! and the user's quota (403 `invalid_request` naming the rule, nothing changed), another
//! user's session 404, the counters and records from the store, the proxy variables of the
//! shell and the python interpreter following the policy at runtime, `users quota --egress`
//! and the CLI's `--egress` checked before any sandbox is made.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::{Value, json};

use sandboxd_core::egress::EgressRecord;
use sandboxd_core::store::EgressLog as _;
use serve::{Api, Env, code};

const WIDEST: &str = "[egress]\nwidest = \"*.example.org,a.test,b.test\"\n";

async fn egress(api: &Api, id: &str) -> (u16, Value) {
    api.json(Method::GET, &format!("/v1/sessions/{id}/egress"), None)
        .await
}

async fn put(api: &Api, id: &str, policy: Value) -> (u16, Value) {
    api.json(
        Method::PUT,
        &format!("/v1/sessions/{id}/egress"),
        Some(json!({ "egress": policy })),
    )
    .await
}

async fn create(api: &Api, body: Value) -> (u16, Value) {
    api.json(Method::POST, "/v1/sessions", Some(body)).await
}

/// `$HTTPS_PROXY|$http_proxy|$NO_PROXY` as the session's persistent bash sees them.
async fn bash(api: &Api, id: &str) -> String {
    let v = api
        .exec(id, "echo \"[$HTTPS_PROXY|$http_proxy|$NO_PROXY]\"")
        .await;
    v["stdout"].as_str().unwrap().trim().to_string()
}

/// The python interpreter's `HTTPS_PROXY` and `https_proxy`, and a child process's `HTTP_PROXY`.
async fn python(api: &Api, id: &str) -> String {
    let code = "import os, subprocess\n\
        print(os.environ.get('HTTPS_PROXY'), os.environ.get('https_proxy'))\n\
        print(subprocess.run(['sh', '-c', 'echo child:$HTTP_PROXY'], capture_output=True, text=True).stdout.strip())";
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/python"),
            Some(json!({ "code": code })),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    v["output"].as_str().unwrap().trim().to_string()
}

#[tokio::test]
async fn the_policy_is_set_shown_and_changed_never_wider_than_allowed() {
    let env = Env::new(WIDEST).await;
    let admin_key = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &["--egress", "*.example.org,a.test"]);
    let carol_key = env.add_user("carol", &[]);
    let serve = env.start();
    let (bob, carol, admin) = (
        Api::new(&serve, &bob_key),
        Api::new(&serve, &carol_key),
        Api::new(&serve, &admin_key),
    );

    // Absent: the admin's default ("off").
    let (s, v) = create(&bob, json!({})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["egress"], json!(["off"]));

    // Wider than the admin's widest, or than bob's quota: 403 naming the rule, no session.
    let (s, v) = create(&bob, json!({"egress": "any"})).await;
    assert_eq!((s, code(&v)), (403, "invalid_request"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"any\"") && msg.contains("[egress] widest"),
        "{msg}"
    );
    let (s, v) = create(&bob, json!({"egress": "b.test"})).await;
    assert_eq!((s, code(&v)), (403, "invalid_request"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("\"b.test\"") && msg.contains("quota"), "{msg}");
    // Malformed: 400 naming the field.
    let (s, v) = create(&bob, json!({"egress": "a.test,no such host!"})).await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("egress"),
        "{v}"
    );
    let (_, me) = bob.json(Method::GET, "/v1/me", None).await;
    assert_eq!(
        me["usage"]["active_sessions"], 1,
        "refused creates made nothing"
    );

    // Within both: created; GET shows the policy, the limits and zero counters.
    let (s, v) = create(
        &bob,
        json!({"egress": ["a.test", "*.example.org", "!ads.example.org"]}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let v_owner = v["owner"].as_str().unwrap().to_string();
    assert_eq!(
        v["egress"],
        json!(["a.test", "*.example.org", "!ads.example.org"])
    );
    let (s, e) = egress(&bob, &id).await;
    assert_eq!(s, 200, "{e}");
    assert_eq!(
        e["policy"],
        json!(["a.test", "*.example.org", "!ads.example.org"])
    );
    assert_eq!(e["widest"], json!(["*.example.org", "a.test", "b.test"]));
    assert_eq!(e["quota"], json!(["*.example.org", "a.test"]));
    assert_eq!(
        e["counters"],
        json!({"connections": 0, "refused": 0, "bytes_up": 0, "bytes_down": 0})
    );
    assert_eq!(e["recent"], json!([]));

    // Narrower: changed at once, in the session's view too.
    let (s, e) = put(&bob, &id, json!("a.test")).await;
    assert_eq!(s, 200, "{e}");
    assert_eq!(e["policy"], json!(["a.test"]));
    let (_, v) = bob
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(v["egress"], json!(["a.test"]));
    // Wider than the quota: refused, nothing changed.
    let (s, v) = put(&bob, &id, json!("a.test,b.test")).await;
    assert_eq!((s, code(&v)), (403, "invalid_request"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("b.test"),
        "{v}"
    );
    assert_eq!(egress(&bob, &id).await.1["policy"], json!(["a.test"]));
    let (s, v) = put(&bob, &id, json!(42)).await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");

    // Another user's session: 404 on both routes, nothing changed; an admin sees it.
    let (s, v) = egress(&carol, &id).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (s, v) = put(&carol, &id, json!("off")).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert_eq!(egress(&bob, &id).await.1["policy"], json!(["a.test"]));
    let (s, v) = egress(&admin, &id).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["quota"],
        json!(["*.example.org", "a.test"]),
        "bob's quota, not the admin's"
    );

    // What the proxy records shows in the counters and the recent list, newest first.
    let owner = v_owner.clone();
    let store = env.store().await;
    for (host, allowed, up, down) in [("a.test", true, 300, 4000), ("evil.test", false, 0, 0)] {
        store
            .add_egress_record(&EgressRecord {
                session: id.clone(),
                owner: owner.clone(),
                method: "CONNECT".into(),
                host: host.into(),
                port: 443,
                allowed,
                rule: if allowed {
                    "a.test"
                } else {
                    "not in the allowlist"
                }
                .into(),
                reason: (!allowed).then(|| "evil.test is not in the allowlist".into()),
                bytes_up: up,
                bytes_down: down,
                started_ms: sandboxd_core::store::now_ms(),
                duration_ms: 12,
            })
            .await
            .unwrap();
    }
    let (_, e) = egress(&bob, &id).await;
    assert_eq!(
        e["counters"],
        json!({"connections": 1, "refused": 1, "bytes_up": 300, "bytes_down": 4000})
    );
    assert_eq!(e["recent"][0]["host"], "evil.test");
    assert_eq!(e["recent"][0]["allowed"], false);
    assert_eq!(e["recent"][0]["rule"], "not in the allowlist");
    assert_eq!(e["recent"][1]["host"], "a.test");
    assert_eq!(e["recent"][1]["bytes_down"], 4000);

    // An ended session's policy does not change.
    let (s, _) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    let (s, v) = put(&bob, &id, json!("off")).await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
}

/// What the sandbox's processes see of the proxy: bash's and python's environment, and a
/// process python starts, before and after the policy changes on the running session.
#[tokio::test]
async fn the_shell_and_python_see_the_proxy_only_while_the_policy_is_not_off() {
    let env = Env::new("").await;
    let key = env.add_user("dana", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = create(&api, json!({"egress": "a.test"})).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let url = "http://127.0.0.1:3128";
    assert_eq!(
        bash(&api, &id).await,
        format!("[{url}|{url}|localhost,127.0.0.1,::1]")
    );
    assert_eq!(python(&api, &id).await, format!("{url} {url}\nchild:{url}"));

    let (s, v) = put(&api, &id, json!("off")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        bash(&api, &id).await,
        "[||]",
        "off unsets the shell's variables"
    );
    assert_eq!(python(&api, &id).await, "None None\nchild:", "and python's");

    let (s, v) = put(&api, &id, json!(["*.example.org"])).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        bash(&api, &id).await,
        format!("[{url}|{url}|localhost,127.0.0.1,::1]")
    );
    assert_eq!(python(&api, &id).await, format!("{url} {url}\nchild:{url}"));

    // A session made without a policy (the default, off) has none.
    let other = api.session().await;
    let v = api.exec(&other, "echo \"[$HTTPS_PROXY]\"").await;
    assert_eq!(v["stdout"].as_str().unwrap().trim(), "[]");
}

/// `sandboxd users quota --egress` keeps the widest policy a user may set; a malformed one
/// is refused naming the flag. The CLI's `--egress` is checked against `[egress] widest`
/// before any sandbox is made, and a command in a session with a policy sees the proxy.
#[tokio::test]
async fn the_cli_sets_quotas_and_checks_its_egress_flag() {
    let env = Env::new("[egress]\nwidest = \"*.example.org\"\n").await;
    env.add_user("erin", &[]);
    let out = env
        .cmd()
        .args(["users", "quota", "erin", "--egress", "a.example.org"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("egress at most a.example.org"), "{err}");
    let store = env.store().await;
    use sandboxd_core::store::Store as _;
    let erin = store.user_by_name("erin").await.unwrap().unwrap();
    assert_eq!(erin.quota.egress.unwrap().to_string(), "a.example.org");

    let out = env
        .cmd()
        .args(["users", "quota", "erin", "--egress", "bad host!"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--egress") && err.contains("bad host!"),
        "{err}"
    );

    // A malformed policy on any command that makes a sandbox: clap's error, naming the flag
    // and what is wrong with the policy.
    for args in [
        &["tool", "--egress", "off,a.example.org", "bash", "{}"][..],
        &["run", "--egress", "*.", "--prompt", "x"][..],
    ] {
        let out = env.cmd().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("--egress <POLICY>"), "{args:?}: {err}");
    }
    let out = env
        .cmd()
        .args(["tool", "--egress", "off,a.example.org", "bash", "{}"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"off\" stands alone"));
    let out = env
        .cmd()
        .args(["exec", "--egress", "any", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--egress any") && err.contains("[egress] widest"),
        "{err}"
    );
    assert!(
        !err.contains("session"),
        "no sandbox was made for it: {err}"
    );
    let out = env
        .cmd()
        .args([
            "exec",
            "--egress",
            " *.example.org ",
            "--",
            "sh",
            "-c",
            "echo [$HTTPS_PROXY]",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[http://127.0.0.1:3128]"
    );
    let out = env
        .cmd()
        .args(["exec", "--", "sh", "-c", "echo [$HTTPS_PROXY]"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[]",
        "the default is off"
    );
}
