//! Single sign-on (`[sso]`) against a real third-party OpenID Connect provider,
//! `oidc-provider-mock` from PyPI (the venv .ci/run makes, SANDBOXD_TEST_OIDC_PYTHON), started
//! on a free loopback port, and a real `sandboxd serve`. At the HTTP level (reqwest carrying
//! the cookies a browser would): a first sign-in creates the user named by the configured
//! claim, not an admin; the admin group makes an admin and leaving it unmakes one; a replayed
//! callback (the same state again) is refused; a callback without the browser's state cookie
//! is refused; every success and failure is
//! in the audit log with `via: "sso"` and the reason. A tampered and an expired ID token, and an
//! unknown user without `create_users`: web_ui_sso_refused.rs; headless Chromium:
//! web_ui_sso_browser.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve};

const CLIENT: &str = "sandboxd-test";
const SECRET_VAR: &str = "SANDBOXD_TEST_SSO_CLIENT_SECRET";

/// The interpreter of the venv with `oidc-provider-mock`: SANDBOXD_TEST_OIDC_PYTHON, else
/// .venv-oidc in the repo (made by .ci/run); neither is a failure, never a skip.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SANDBOXD_TEST_OIDC_PYTHON") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-oidc/bin/python");
    assert!(
        repo.exists(),
        "SANDBOXD_TEST_OIDC_PYTHON is not set and .venv-oidc is missing: python3 -m venv .venv-oidc && .venv-oidc/bin/pip install 'oidc-provider-mock==0.3.4'"
    );
    repo
}

/// The mock provider as a child process; killed on drop.
pub struct Provider {
    child: Child,
    pub base: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Provider {
    /// Starts the mock on a free loopback port; `token_max_age` below zero makes every token
    /// it issues already expired.
    pub async fn start(token_max_age: i64) -> Provider {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(python())
            .args(["-m", "oidc_provider_mock", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--token-max-age", &token_max_age.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start oidc-provider-mock");
        let p = Provider {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        let discovery = format!("{}/.well-known/openid-configuration", p.base);
        loop {
            if let Ok(r) = reqwest::get(&discovery).await
                && r.status() == 200
            {
                return p;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "oidc-provider-mock did not answer at {discovery}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets the claims the mock puts in `sub`'s ID tokens (its `PUT /users/{sub}`).
    pub async fn set_user(&self, sub: &str, claims: Value) {
        let r = reqwest::Client::new()
            .put(format!("{}/users/{sub}", self.base))
            .json(&claims)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{:?}", r.text().await);
    }
}

pub fn sso_config(issuer: &str, extra: &str) -> String {
    format!(
        "[sso]\nissuer = {issuer:?}\nclient_id = {CLIENT:?}\nclient_secret_env = {SECRET_VAR:?}\nadmin_group = \"sandboxd-admins\"\n{extra}"
    )
}

pub fn start_serve(env: &Env) -> Serve {
    let mut cmd = env.cmd();
    cmd.env(SECRET_VAR, "a-client-secret")
        .args(["serve", "--listen", "127.0.0.1:0"]);
    Serve::spawn(cmd)
}

pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

pub fn cookie_of(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap().trim().to_string())
        .find(|c| c.starts_with(&format!("{name}=")) && c.len() > name.len() + 1)
}

/// One trip through the flow up to the callback: the callback URL the provider sent the
/// browser to, and the state cookie serve set.
pub async fn to_callback(http: &reqwest::Client, serve: &Serve, sub: &str) -> (String, String) {
    let r = http.get(serve.url("/login/sso")).send().await.unwrap();
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    let state_cookie = cookie_of(&r, "sandboxd_sso").expect("the state cookie");
    let authorize = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        authorize.contains("code_challenge_method=S256"),
        "{authorize}"
    );
    assert!(authorize.contains("nonce="), "{authorize}");
    let r = http
        .post(&authorize)
        .form(&[("sub", sub)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        302,
        "the mock's authorize: {:?}",
        r.text().await
    );
    let callback = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        callback.starts_with(&serve.url("/login/sso/callback?")),
        "{callback}"
    );
    (callback, state_cookie)
}

/// The full flow at the HTTP level: the callback's answer (status, session cookie, body).
pub async fn sign_in(
    http: &reqwest::Client,
    serve: &Serve,
    sub: &str,
) -> (u16, Option<String>, String) {
    let (callback, state_cookie) = to_callback(http, serve, sub).await;
    let r = http
        .get(&callback)
        .header("cookie", &state_cookie)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let session = cookie_of(&r, "sandboxd_session");
    (status, session, r.text().await.unwrap())
}

pub async fn page(
    http: &reqwest::Client,
    serve: &Serve,
    path: &str,
    cookie: &str,
) -> (u16, String) {
    let r = http
        .get(serve.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

pub async fn user(root: &Api, name: &str) -> Value {
    let (s, v) = root.json(Method::GET, "/v1/users", None).await;
    assert_eq!(s, 200, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The web sign-in entries of the audit log, oldest first: (action, actor, details).
pub async fn sign_ins(root: &Api) -> Vec<(String, String, Value)> {
    let (s, v) = root.json(Method::GET, "/v1/audit?limit=200", None).await;
    assert_eq!(s, 200, "{v}");
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("sign_in"))
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["actor"].as_str().unwrap().to_string(),
                e["details"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sign_in_creates_the_user_the_admin_group_makes_an_admin_and_a_state_works_once() {
    let provider = Provider::start(3600).await;
    let env = Env::new(&sso_config(&provider.base, "")).await;
    let root_key = env.add_user("root", &["--admin"]);
    let serve = start_serve(&env);
    let root = Api::new(&serve, &root_key);
    let http = no_redirects();

    // The sign-in page offers single sign-on.
    let (s, html) = page(&http, &serve, "/login", "").await;
    assert_eq!(s, 200);
    assert!(html.contains("href=\"/login/sso\""), "{html}");

    // A first sign-in creates the user the configured claim names, not an admin.
    provider
        .set_user(
            "sub-alice",
            json!({"preferred_username": "alice", "email": "alice@example.com", "groups": ["staff"]}),
        )
        .await;
    assert!(user(&root, "alice").await.is_null());
    let (callback, state_cookie) = to_callback(&http, &serve, "sub-alice").await;
    let r = http
        .get(&callback)
        .header("cookie", &state_cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the callback: {:?}", r.text().await);
    let session = cookie_of(&r, "sandboxd_session").expect("a sign-in cookie");
    let set: Vec<_> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        set.iter().any(|c| c.starts_with("sandboxd_session=")
            && c.contains("HttpOnly")
            && c.contains("SameSite=Strict")),
        "{set:?}"
    );
    assert!(
        set.iter()
            .any(|c| c.starts_with("sandboxd_sso=;") && c.contains("Max-Age=0")),
        "the state cookie is cleared: {set:?}"
    );
    let body = r.text().await.unwrap();
    assert!(body.contains("url=/runs"), "{body}");
    let alice = user(&root, "alice").await;
    assert_eq!(alice["admin"], false, "{alice}");
    // Her key (made with her, shown to nobody) is listed by prefix and date, never by value;
    // an admin's rotation gives her one for scripts.
    assert!(
        alice["key_prefix"].as_str().unwrap().starts_with("sbx_"),
        "{alice}"
    );
    assert!(alice["key_created_at"].is_string(), "{alice}");
    assert!(alice.get("key").is_none(), "{alice}");
    let (s, html) = page(&http, &serve, "/runs", &session).await;
    assert_eq!(s, 200);
    assert!(
        html.contains("<span class=\"who\">alice</span>"),
        "signed in as alice: {html}"
    );
    let (s, html) = page(&http, &serve, "/admin", &session).await;
    assert!(
        !html.contains("data-page=\"admin\""),
        "alice is no admin ({s})"
    );

    // The same callback again (a replayed state) is refused, even with its cookie.
    let r = http
        .get(&callback)
        .header("cookie", &state_cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(cookie_of(&r, "sandboxd_session").is_none());
    let text = r.text().await.unwrap();
    assert!(text.contains("unknown, expired or already used"), "{text}");

    // A callback without this browser's state cookie (login CSRF) is refused.
    let (callback, _) = to_callback(&http, &serve, "sub-alice").await;
    let r = http.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(cookie_of(&r, "sandboxd_session").is_none());

    // The admin group makes an admin; a later sign-in without it unmakes them.
    provider
        .set_user(
            "sub-bob",
            json!({"preferred_username": "bob", "groups": ["staff", "sandboxd-admins"]}),
        )
        .await;
    let (s, bob_session, body) = sign_in(&http, &serve, "sub-bob").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(user(&root, "bob").await["admin"], true);
    let (s, html) = page(&http, &serve, "/admin", &bob_session.unwrap()).await;
    assert_eq!(s, 200);
    assert!(html.contains("data-page=\"admin\""), "{html}");
    provider
        .set_user(
            "sub-bob",
            json!({"preferred_username": "bob", "groups": ["staff"]}),
        )
        .await;
    let (s, _, body) = sign_in(&http, &serve, "sub-bob").await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(user(&root, "bob").await["admin"], false);

    // A name that is no valid user name is refused with the reason.
    provider
        .set_user("sub-eve", json!({"preferred_username": "eve smith"}))
        .await;
    let (s, session, body) = sign_in(&http, &serve, "sub-eve").await;
    assert_eq!(s, 403, "{body}");
    assert!(session.is_none());
    assert!(body.contains("user name"), "{body}");

    // Every success and failure is audited with the reason.
    let got = sign_ins(&root).await;
    let summary: Vec<(&str, &str)> = got
        .iter()
        .map(|(a, who, _)| (a.as_str(), who.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("sign_in", "alice"),
            ("sign_in.failed", "-"),
            ("sign_in.failed", "-"),
            ("sign_in", "bob"),
            ("sign_in", "bob"),
            ("sign_in.failed", "-"),
        ],
        "{got:#?}"
    );
    for (_, _, d) in &got {
        assert_eq!(d["via"], "sso", "{d}");
    }
    assert_eq!(got[0].2["created"], true);
    assert_eq!(got[0].2["subject"], "sub-alice");
    assert!(
        got[1].2["reason"]
            .as_str()
            .unwrap()
            .contains("already used"),
        "{:?}",
        got[1]
    );
    assert!(
        got[2].2["reason"]
            .as_str()
            .unwrap()
            .contains("not started in this browser"),
        "{:?}",
        got[2]
    );
    assert_eq!(got[3].2["admin"], true);
    assert_eq!(got[4].2["admin"], false);
    let all = serde_json::to_string(&got).unwrap();
    assert!(
        !all.contains("a-client-secret"),
        "the client secret is never audited"
    );
    assert!(
        !serve.log.lock().unwrap().contains("a-client-secret"),
        "nor logged"
    );
}
