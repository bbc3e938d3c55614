//! Users' own egress credentials (issue 24, item 5) through a real `serve`, the real engine
//! and image: ann attaches a credential to an HTTPS "API" on this host (`localhost`, opened
//! by the admin's `[research] allow`) while her session runs; the next connection from the
//! sandbox carries the header (before it, the host was tunneled untouched and got none);
//! after she removes it, the next one goes without again. Then the value is looked for
//! everywhere it must not be: every API answer of the test, a run's events, the session's
//! egress records, serve's log, the sandbox (env, /proc, every file: the same searches as
//! serve_egress_inject.rs, each first shown to find a canary) and the SQLite files (the
//! database and its WAL, shown to hold the row). Bob can neither see nor remove ann's
//! credential (404), and his session's connections to the same host carry nothing.
//!
//! `the_api_refuses_what_it_must` covers the edges without a sandbox: no key configured
//! (409 saying how to set one), the bound per user (429), a host outside the user's quota
//! (403), bad fields (400), an admin acting for a user with `?user=`.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use reqwest::Method;
use serde_json::{Value, json};

use crate::egress::support::echo_https;
use crate::serve::runs::{SERVER, follow_all, llm_config, start_run};
use crate::serve::{Api, Env, code};
use crate::serve_egress_inject::{assert_absent_from_sandbox, exec};
use crate::support::fake_llm::{FakeLlm, Reply};

/// A key file as the admin would make it (`openssl rand -hex 32`, mode 0600).
pub(crate) fn key_file(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("credential.key");
    std::fs::write(
        &path,
        format!(
            "{:032x}{:032x}\n",
            rand::random::<u128>(),
            rand::random::<u128>()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Every answer of the test, kept to be searched for the secret at the end.
#[derive(Default)]
struct Answers(Vec<String>);

impl Answers {
    async fn call(
        &mut self,
        api: &Api,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let (s, v) = api.json(method, path, body).await;
        self.0.push(v.to_string());
        (s, v)
    }
}

/// curl from the sandbox to the API through the proxy; `-k` while the host is tunneled
/// (its own self-signed certificate), never with a credential (the session CA is trusted).
fn curl(port: u16, path: &str, insecure: bool) -> String {
    format!(
        "env -u NO_PROXY -u no_proxy curl -sS {} --max-time 30 https://localhost:{port}{path}",
        if insecure { "-k" } else { "" }
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_users_credential_reaches_the_api_from_the_next_connection_and_leaks_nowhere() {
    let secret = format!("sk-user-{:032x}", rand::random::<u128>());
    let api_srv = echo_https("127.0.0.1".parse().unwrap(), vec!["localhost".into()]).await;
    let port = api_srv.port;
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({ "command": curl(port, "/run", false) })),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &api_srv.root_pem).unwrap();
    let key = key_file(dir.path());
    let env = Env::new(&format!(
        "{}{SERVER}[research]\nallow = [\"localhost\"]\nports = [80, 443, {port}]\n\
         [egress]\nwidest = \"any\"\nextra_roots_pem = {:?}\ncredential_key_file = {:?}\n",
        llm_config(&llm),
        roots.display().to_string(),
        key.display().to_string(),
    ))
    .await;
    let (ann_key, bob_key) = (env.add_user("ann", &[]), env.add_user("bob", &[]));
    let serve = env.start_logging("info,sandboxd=debug,sandboxd_core=debug,sandboxd_server=debug");
    let (ann, bob) = (Api::new(&serve, &ann_key), Api::new(&serve, &bob_key));
    let mut seen = Answers::default();
    let body = Some(json!({"egress": "localhost"}));
    let (s, v) = seen
        .call(&ann, Method::POST, "/v1/sessions", body.clone())
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();

    // Before: tunneled untouched, no header.
    let out = exec(&ann, &id, &curl(port, "/before", true)).await;
    assert!(out.contains("api saw:\nGET /before"), "{out}");
    let attach = json!({"header": "Authorization", "prefix": "Bearer ", "value": secret});
    let (s, v) = seen
        .call(
            &ann,
            Method::PUT,
            "/v1/egress/credentials/localhost",
            Some(attach),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["host"].as_str(), v["header"].as_str()),
        (Some("localhost"), Some("Authorization"))
    );
    // The next connection of the running session carries it; the sandbox sees it masked.
    let out = exec(&ann, &id, &curl(port, "/after", false)).await;
    assert!(out.contains("api saw:\nGET /after"), "{out}");
    assert!(out.contains("Authorization: Bearer ****"), "{out}");
    let bearer = format!("Authorization: Bearer {secret}\r\n");
    let heads = api_srv.heads.lock().unwrap().clone();
    let with = |p: &str| heads.iter().any(|h| h.contains(p) && h.contains(&bearer));
    assert!(!with("GET /before") && with("GET /after"), "{heads:?}");

    // A run's events: its bash step reaches the API with the header, the events show none.
    let run = start_run(&ann, json!({"task": "call the API", "session_id": id})).await;
    let events = follow_all(&ann, run["id"].as_str().unwrap()).await;
    let events =
        serde_json::to_string(&events.iter().map(|e| e.data.clone()).collect::<Vec<_>>()).unwrap();
    assert!(
        events.contains("GET /run") && events.contains("Bearer ****"),
        "{events}"
    );
    assert!(
        api_srv
            .heads
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("GET /run") && h.contains(&bearer))
    );

    // Listed (never the value); bob sees none of it and cannot remove it.
    let (s, v) = seen
        .call(&ann, Method::GET, "/v1/egress/credentials", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    let (s, v) = seen
        .call(&bob, Method::GET, "/v1/egress/credentials", None)
        .await;
    assert_eq!((s, v.clone()), (200, json!([])), "{v}");
    let (s, v) = seen
        .call(
            &bob,
            Method::DELETE,
            "/v1/egress/credentials/localhost",
            None,
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (s, v) = seen
        .call(&bob, Method::GET, "/v1/egress/credentials?user=ann", None)
        .await;
    assert_eq!(s, 404, "{v}");
    // Bob's own session to the same host carries nothing of ann's.
    let (s, v) = seen
        .call(&bob, Method::POST, "/v1/sessions", body.clone())
        .await;
    assert_eq!(s, 201, "{v}");
    let bob_id = v["id"].as_str().unwrap().to_string();
    let out = exec(&bob, &bob_id, &curl(port, "/bob", true)).await;
    assert!(
        out.contains("api saw:\nGET /bob") && !out.contains("Authorization"),
        "{out}"
    );
    for path in ["", "/egress"] {
        seen.call(&ann, Method::GET, &format!("/v1/sessions/{id}{path}"), None)
            .await;
    }
    seen.call(&ann, Method::GET, "/v1/me", None).await;

    assert_absent_from_sandbox(&ann, &id, &secret).await;
    // The database and its WAL hold the row (its header), never the value.
    let mut db = Vec::new();
    for suffix in ["", "-wal"] {
        let path = format!("{}{suffix}", env.db().display());
        db.extend(std::fs::read(&path).unwrap_or_default());
    }
    let holds = |needle: &[u8]| db.windows(needle.len()).any(|w| w == needle);
    assert!(
        holds(b"Authorization") && holds(b"localhost"),
        "the search must find the row"
    );
    assert!(
        !holds(secret.as_bytes()),
        "the secret is in the database in clear text"
    );

    // Removed: the next connection goes without it.
    let (s, _) = seen
        .call(
            &ann,
            Method::DELETE,
            "/v1/egress/credentials/localhost",
            None,
        )
        .await;
    assert_eq!(s, 204);
    let out = exec(&ann, &id, &curl(port, "/removed", true)).await;
    assert!(
        out.contains("api saw:\nGET /removed") && !out.contains("Authorization"),
        "{out}"
    );

    let log = serve.log.lock().unwrap().clone();
    assert!(
        log.contains("egress credential attached"),
        "the log names the change"
    );
    let answers = seen.0.join("\n");
    for (what, text) in [
        ("events", &events),
        ("API answers", &answers),
        ("log", &log),
    ] {
        assert!(!text.contains(&secret), "the secret is in the {what}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_refuses_what_it_must() {
    let put = |value: &str| json!({"header": "X-Api-Key", "value": value});
    // Without a key: refused, and the message says how to set one.
    let env = Env::new("").await;
    let k = env.add_user("ann", &[]);
    let serve = env.start();
    let ann = Api::new(&serve, &k);
    let (s, v) = ann
        .json(
            Method::PUT,
            "/v1/egress/credentials/api.example.com",
            Some(put("v1")),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("credential_key_file") && m.contains("openssl rand -hex 32"),
        "{m}"
    );
    drop(serve);

    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let env = Env::new(&format!(
        "[egress]\nwidest = \"*.example.com\"\nuser_credentials = 2\ncredential_key_file = {:?}\n",
        key.display().to_string()
    ))
    .await;
    let (ak, bk) = (
        env.add_user("ann", &[]),
        env.add_user("bob", &["--egress", "a.example.com"]),
    );
    let rk = env.add_user("root", &["--admin"]);
    let serve = env.start();
    let (ann, bob, root) = (
        Api::new(&serve, &ak),
        Api::new(&serve, &bk),
        Api::new(&serve, &rk),
    );
    let path = |h: &str| format!("/v1/egress/credentials/{h}");
    for h in ["a.example.com", "b.example.com"] {
        let (s, v) = ann.json(Method::PUT, &path(h), Some(put("v"))).await;
        assert_eq!(s, 200, "{v}");
    }
    // The same host again replaces; a third host is over the bound.
    let (s, _) = ann
        .json(
            Method::PUT,
            &path("a.example.com"),
            Some(put("zq-secret-v2")),
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = ann
        .json(Method::PUT, &path("c.example.com"), Some(put("v")))
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    // Outside the admin's widest, outside bob's quota: 403 naming why.
    let (s, v) = ann
        .json(Method::PUT, &path("example.org"), Some(put("v")))
        .await;
    assert_eq!((s, code(&v)), (403, "invalid_request"), "{v}");
    let (s, v) = bob
        .json(Method::PUT, &path("b.example.com"), Some(put("v")))
        .await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("quota"),
        "{v}"
    );
    // Bad fields: 400, the value never quoted.
    let long = "x".repeat(9000);
    for (host, body) in [
        ("a.example.com", put(&long)),
        ("a.example.com", put("line\nbreak")),
        ("a.example.com", json!({"header": "Host", "value": "v"})),
        (
            "a.example.com",
            json!({"header": "Bad Header", "value": "v"}),
        ),
        ("*.example.com", put("v")),
        ("127.0.0.1", put("v")),
    ] {
        let (s, v) = bob.json(Method::PUT, &path(host), Some(body)).await;
        assert_eq!((s, code(&v)), (400, "invalid_request"), "{host}: {v}");
        assert!(!v.to_string().contains("line\\nbreak") && !v.to_string().contains(&long));
    }
    // The admin acts for ann; ann's listing has hosts, never values.
    let (s, v) = root
        .json(
            Method::DELETE,
            &format!("{}?user=ann", path("b.example.com")),
            None,
        )
        .await;
    assert_eq!(s, 204, "{v}");
    let (s, v) = root
        .json(Method::GET, "/v1/egress/credentials?user=ann", None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["host"], "a.example.com");
    assert!(!v.to_string().contains("zq-secret-v2"), "{v}");
    let (s, _) = root
        .json(Method::GET, "/v1/egress/credentials?user=nobody", None)
        .await;
    assert_eq!(s, 404);
}
