//! The egress proxy as `serve` runs it (issue 24): a session whose policy allows a host
//! reaches it from bash through the proxy on its own loopback (curl reads the proxy
//! variables serve set), the store keeps the record with the rule that allowed it, and a PUT
//! to `off` on the running session refuses the very next connection with the rule named.
//! The "internet" is a server on this host's own non-loopback address, opened by the
//! admin's `[research] allow` exactly as web_fetch would need.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::net::IpAddr;

use crate::egress::support::host_address;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use serve::{Api, Env};

/// A tiny HTTP server on `addr`: every request gets "hello from the host".
async fn host_server(addr: IpAddr) -> u16 {
    let listener = tokio::net::TcpListener::bind((addr, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "hello from the host";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    });
    port
}

async fn curl(api: &Api, id: &str, url: &str) -> String {
    let v = api
        .exec(id, &format!("curl -s -i --max-time 20 {url} 2>&1; echo"))
        .await;
    v["stdout"].as_str().unwrap().to_string()
}

/// GET /v1/sessions/{id}/egress until its records satisfy `pred` (they are written when a
/// connection ends, just after curl has its answer).
async fn records_until(api: &Api, id: &str, pred: impl Fn(&[Value]) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = api
            .json(Method::GET, &format!("/v1/sessions/{id}/egress"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        let recs = v["recent"].as_array().cloned().unwrap_or_default();
        if pred(&recs) {
            return v;
        }
        assert!(Instant::now() < deadline, "records never matched: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_session_reaches_an_allowed_host_through_its_proxy_until_its_policy_is_turned_off() {
    let addr = host_address();
    let port = host_server(addr).await;
    let env = Env::new(&format!(
        "[research]\nallow = [\"{addr}\"]\nports = [80, 443, {port}]\n[egress]\nwidest = \"any\"\n"
    ))
    .await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({ "egress": addr.to_string() })),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let url = format!("http://{addr}:{port}/page");

    let out = curl(&api, &id, &url).await;
    assert!(out.contains("hello from the host"), "{out}");
    let rule = addr.to_string();
    let v = records_until(&api, &id, |r| {
        r.iter()
            .any(|r| r["allowed"] == true && r["rule"] == rule.as_str())
    })
    .await;
    assert_eq!(v["recent"][0]["port"], port, "{v}");

    // Turned off while the session runs: the next connection is refused, with the rule.
    let (s, v) = api
        .json(
            Method::PUT,
            &format!("/v1/sessions/{id}/egress"),
            Some(json!({ "egress": "off" })),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let out = curl(&api, &id, &format!("--proxy http://127.0.0.1:3128 {url}")).await;
    assert!(
        out.contains("403") && !out.contains("hello from the host"),
        "{out}"
    );
    records_until(&api, &id, |r| {
        r.iter()
            .any(|r| r["allowed"] == false && r["rule"] == "egress off")
    })
    .await;
}
