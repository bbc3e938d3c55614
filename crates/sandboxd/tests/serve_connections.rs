//! `sandboxd serve` under connection attacks, as a real process on loopback: half-sent
//! requests are closed at the header timeout while /healthz answers; with a low open-file
//! limit and more stalled connections than the cap, /healthz and an API call that creates a
//! session still succeed and serve never runs out of descriptors; kept-alive connections
//! with nothing in them are closed at the idle timeout, while a request in flight longer
//! than both timeouts is not cut.
//!
//! Every wait is bounded and generous (the machine is shared): the assertions are about
//! whether a connection is closed, never about how fast.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use serve::{Api, Env, Serve};

/// Far longer than any timeout the tests configure: a connection still open after this was
/// never going to be closed.
const BOUND: Duration = Duration::from_secs(60);
/// Half a request: the request line and one header, never the blank line that ends the head.
const HALF_REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";

fn server_section(keys: &str) -> String {
    format!("[server]\ndrain_secs = 2\nauth_failures_per_minute = 10000\n{keys}\n")
}

fn addr(serve: &Serve) -> String {
    serve.base.trim_start_matches("http://").to_string()
}

/// Up to `n` connections that each send half a request and stall. The first connect that
/// fails (a server that stopped accepting has a full backlog) ends the attack: whether the
/// service still answers is what the tests check.
async fn stalled_connections(serve: &Serve, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let connect = TcpStream::connect(addr(serve));
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(5), connect).await else {
            break;
        };
        // A write can fail if the server already closed it (at the cap): that is fine.
        let _ = c.write_all(HALF_REQUEST).await;
        conns.push(c);
    }
    conns
}

/// Whether the server closed the connection (EOF or reset) before `deadline`.
async fn closed_by(conn: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // An error response before the close is allowed; keep reading to the close.
            Ok(Ok(_)) => continue,
        }
    }
}

/// A client that opens a fresh connection per request (no pooled one to reuse).
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// GET /healthz until it answers 200 (bounded): under attack a try may meet a closed
/// connection, but the service must come back without anyone's help.
async fn healthz_answers(serve: &Serve) {
    let client = fresh_client();
    let deadline = Instant::now() + BOUND;
    let mut last = String::new();
    while Instant::now() < deadline {
        match client.get(serve.url("/healthz")).send().await {
            Ok(r) if r.status() == 200 => return,
            Ok(r) => last = format!("status {}", r.status()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "/healthz did not answer within {BOUND:?} ({last}): {}",
        serve.log.lock().unwrap()
    );
}

#[tokio::test]
async fn half_sent_requests_are_closed_at_the_header_timeout_while_healthz_answers() {
    let env = Env::new(&server_section(
        "header_timeout_secs = 2\nidle_timeout_secs = 2",
    ))
    .await;
    let serve = env.start();
    let mut conns = stalled_connections(&serve, 60).await;
    assert_eq!(conns.len(), 60, "all 60 connect (far below the cap)");
    healthz_answers(&serve).await;
    let deadline = Instant::now() + BOUND;
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(
            closed_by(c, deadline).await,
            "stalled connection {i} was still open {BOUND:?} after it stalled (header timeout 2 s)"
        );
    }
    healthz_answers(&serve).await;
}

#[tokio::test]
async fn a_flood_of_stalled_connections_under_a_low_file_limit_does_not_stop_the_service() {
    let env = Env::new(&server_section(
        "header_timeout_secs = 3\nidle_timeout_secs = 3\nmax_connections = 64",
    ))
    .await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    // A low limit, soft and hard (serve raises soft to hard at start, so both go down).
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &serve.pid().to_string(), "--nofile=256:256"])
        .output()
        .expect("prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // More stalled connections than the whole file limit, let alone the cap.
    let conns = stalled_connections(&serve, 400).await;
    healthz_answers(&serve).await;
    // An authenticated call that needs the Docker engine: create a session, run in it.
    let api = Api {
        http: fresh_client(),
        ..Api::new(&serve, &key)
    };
    let deadline = Instant::now() + BOUND;
    let id = loop {
        match api
            .req(Method::POST, "/v1/sessions")
            .json(&json!({}))
            .send()
            .await
        {
            Ok(r) if r.status() == 201 => {
                let v: serde_json::Value = r.json().await.unwrap();
                break v["id"].as_str().unwrap().to_string();
            }
            other => assert!(
                Instant::now() < deadline,
                "no session within {BOUND:?}: {other:?}: {}",
                serve.log.lock().unwrap()
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let out = api.exec(&id, "echo still-serving").await;
    assert!(
        out["stdout"].as_str().unwrap().contains("still-serving"),
        "{out}"
    );
    let (s, _) = api
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    drop(conns);
    let log = serve.log.lock().unwrap().clone();
    assert!(
        !log.contains("Too many open files"),
        "serve ran out of descriptors: {log}"
    );
    assert!(
        log.contains("at the connection cap"),
        "400 connections against a cap of 64 must meet the cap: {log}"
    );
}

/// Reads one HTTP/1.1 response with a Content-Length body; returns its head.
async fn read_response(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(BOUND, conn.read(&mut chunk))
            .await
            .expect("a response")
            .expect("read");
        assert!(n > 0, "closed before the response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let head = text[..end].to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .expect("content-length");
        if buf.len() >= end + 4 + length {
            return head;
        }
    }
}

#[tokio::test]
async fn a_kept_alive_connection_with_no_request_is_closed_at_the_idle_timeout() {
    // The header timeout is far longer than the wait below: only the idle timeout can close.
    let env = Env::new(&server_section(
        "header_timeout_secs = 600\nidle_timeout_secs = 2",
    ))
    .await;
    let serve = env.start();
    let mut conn = TcpStream::connect(addr(&serve)).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    // Two requests on the one connection: it is kept alive between them.
    for _ in 0..2 {
        conn.write_all(request).await.unwrap();
        let head = read_response(&mut conn).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    assert!(
        closed_by(&mut conn, deadline).await,
        "an idle kept-alive connection was still open 30 s after its last response (idle timeout 2 s)"
    );
}

#[tokio::test]
async fn requests_in_flight_longer_than_both_timeouts_are_not_cut() {
    let env = Env::new(&server_section(
        "header_timeout_secs = 1\nidle_timeout_secs = 1",
    ))
    .await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    // A plain exec that answers after the timeouts.
    let out = api.exec(&id, "sleep 4; echo slept").await;
    assert!(out["stdout"].as_str().unwrap().contains("slept"), "{out}");
    // A stream that is silent for longer than the timeouts, then ends with its exit event.
    let r = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec/stream"))
        .json(&json!({"command": "sleep 4; echo streamed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = tokio::time::timeout(BOUND, r.text())
        .await
        .expect("the stream ends")
        .expect("the stream is not cut");
    assert!(
        body.contains("streamed") && body.contains("event: exit"),
        "{body}"
    );
}
