//! Nobody locks anybody else out (issue 20, point 1), against a real `sandboxd serve`: the
//! failed-authentication throttle counts only failures, per client address, and that address
//! comes from `X-Forwarded-For` only when the peer is a configured trusted proxy. The test
//! client on 127.0.0.1 stands in for the reverse proxy: every request has its address, and
//! the header says which client it forwards.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve, code};

const ATTACKER: &str = "203.0.113.66";
const COLLEAGUE: &str = "198.51.100.7";
const LIMIT: u32 = 3;

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// GET /v1/me with `key`, forwarded for `xff` (None: no header).
async fn me(http: &reqwest::Client, serve: &Serve, key: &str, xff: Option<&str>) -> (u16, Value) {
    let mut r = http.get(serve.url("/v1/me")).bearer_auth(key);
    if let Some(x) = xff {
        r = r.header("x-forwarded-for", x);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// An MCP initialize POST with `key`, forwarded for `xff`; its status.
async fn mcp_initialize(http: &reqwest::Client, serve: &Serve, key: &str, xff: &str) -> u16 {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    http.post(serve.url("/mcp"))
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .header("x-forwarded-for", xff)
        .json(&init)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The web sign-in form with `key`, forwarded for `xff`; its status.
async fn sign_in(http: &reqwest::Client, serve: &Serve, key: &str, xff: &str) -> u16 {
    http.post(serve.url("/login"))
        .header("x-forwarded-for", xff)
        .form(&[("key", key)])
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn garbage(i: u32) -> String {
    format!("sbx_not-a-real-key-{i:040}")
}

#[tokio::test]
async fn garbage_keys_through_the_proxy_lock_out_only_their_sender() {
    let env = Env::new(&format!(
        "[server]\ndrain_secs = 2\nauth_failures_per_minute = {LIMIT}\ntrusted_proxies = [\"127.0.0.1\"]\n"
    ))
    .await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    let http = no_redirects();

    // The attacker's garbage, forwarded by the proxy: 401 up to the limit, then 429.
    for i in 0..LIMIT {
        let (s, v) = me(&http, &serve, &garbage(i), Some(ATTACKER)).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "failure {i}: {v}");
    }
    let (s, v) = me(&http, &serve, &garbage(99), Some(ATTACKER)).await;
    assert_eq!((s, code(&v)), (429, "rate_limited"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(ATTACKER),
        "the message names the client, not the proxy: {v}"
    );

    // A valid key is answered, from another client behind the same proxy and from the
    // attacker's own address, on the API, on /mcp and at the web sign-in.
    for xff in [COLLEAGUE, ATTACKER] {
        let (s, v) = me(&http, &serve, &key, Some(xff)).await;
        assert_eq!(s, 200, "a valid key forwarded for {xff}: {v}");
        assert_eq!(v["name"], "alice");
        assert_eq!(
            mcp_initialize(&http, &serve, &key, xff).await,
            200,
            "/mcp with a valid key forwarded for {xff}"
        );
        assert_eq!(
            sign_in(&http, &serve, &key, xff).await,
            303,
            "the web sign-in with a valid key forwarded for {xff}"
        );
    }
    // Without the header the client is the proxy itself, which failed nothing.
    let (s, v) = me(&http, &serve, &key, None).await;
    assert_eq!(s, 200, "{v}");

    // The attacker is still throttled (a valid key from that address resets nothing), at the
    // sign-in form too; another client's first bad key is an ordinary 401.
    let (s, v) = me(&http, &serve, &garbage(100), Some(ATTACKER)).await;
    assert_eq!((s, code(&v)), (429, "rate_limited"), "{v}");
    assert_eq!(sign_in(&http, &serve, &garbage(101), ATTACKER).await, 429);
    let (s, v) = me(&http, &serve, &garbage(102), Some(COLLEAGUE)).await;
    assert_eq!((s, code(&v)), (401, "unauthorized"), "{v}");

    // The access log names the client behind the proxy beside the peer (the line is read
    // from serve's stderr by another thread: wait for it, bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let log = plain(&serve.log.lock().unwrap());
        let logged = log
            .lines()
            .any(|l| l.contains(&format!("client={ATTACKER}")) && l.contains("peer=127.0.0.1"));
        if logged {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no access log line with the client: {log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The log without ANSI colour sequences (the formatter may colour field names).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test]
async fn without_trusted_proxies_a_forged_forwarded_for_is_ignored() {
    let env = Env::new(&format!(
        "[server]\ndrain_secs = 2\nauth_failures_per_minute = {LIMIT}\n"
    ))
    .await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let http = no_redirects();

    // Each garbage key claims another address; all are counted against the peer.
    for i in 0..LIMIT {
        let forged = format!("192.0.2.{}", i + 1);
        let (s, v) = me(&http, &serve, &garbage(i), Some(&forged)).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "failure {i}: {v}");
    }
    let (s, v) = me(&http, &serve, &garbage(50), Some("192.0.2.200")).await;
    assert_eq!((s, code(&v)), (429, "rate_limited"), "{v}");
    let (s, v) = me(&http, &serve, &garbage(51), None).await;
    assert_eq!((s, code(&v)), (429, "rate_limited"), "{v}");
    // And the peer's valid key is still answered.
    let (s, v) = me(&http, &serve, &key, None).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = Api::new(&serve, &key)
        .json(Method::GET, "/v1/sessions", None)
        .await;
    assert_eq!(s, 200, "{v}");
}
