//! `Server` in this process over the fake runtime (harness.rs): keys, 404 isolation on every
//! route that takes an id, quotas and cursor paging, without Docker. Each test starts its own
//! server on a loopback port with its own data directory.

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{code, start};

#[tokio::test]
async fn a_missing_or_wrong_key_is_401_everywhere_but_health() {
    let (serve, _) = start(&[("ann", None)]).await;
    for path in ["/v1/sessions", "/v1/runs", "/v1/me", "/v1/tools", "/mcp"] {
        let (s, v) = serve.call("sbx_wrong", Method::GET, path, None).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "{path}: {v}");
    }
    let r = serve
        .http
        .get(format!("{}/healthz", serve.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = serve
        .http
        .get(format!("{}/readyz", serve.base))
        .send()
        .await
        .unwrap();
    let ready: Value = r.json().await.unwrap();
    assert_eq!(
        ready["status"], "ok",
        "the fake runtime has no checks: {ready}"
    );
}

#[tokio::test]
async fn another_users_session_is_404_on_every_route_exactly_like_a_missing_one() {
    let (serve, keys) = start(&[("ann", None), ("bob", None)]).await;
    let (ann, bob) = (&keys[0], &keys[1]);
    let id = serve.session(ann).await;
    let missing = "0123456789ab";
    let routes = |id: &str| {
        vec![
            (Method::GET, format!("/v1/sessions/{id}")),
            (Method::DELETE, format!("/v1/sessions/{id}")),
            (Method::DELETE, format!("/v1/sessions/{id}/history")),
            (
                Method::GET,
                format!("/v1/sessions/{id}/files?path=/workspace"),
            ),
            (Method::GET, format!("/v1/sessions/{id}/runs")),
            (Method::POST, format!("/v1/sessions/{id}/exec")),
        ]
    };
    for ((method, theirs), (_, nobodys)) in routes(&id).into_iter().zip(routes(missing)) {
        let body = (method == Method::POST).then(|| json!({"command": "true"}));
        let (s1, v1) = serve.call(bob, method.clone(), &theirs, body.clone()).await;
        let (s2, v2) = serve.call(bob, method.clone(), &nobodys, body).await;
        assert_eq!(
            (s1, code(&v1)),
            (404, "not_found"),
            "{method} {theirs}: {v1}"
        );
        assert_eq!(
            (s1, code(&v1)),
            (s2, code(&v2)),
            "{method}: theirs and nobody's differ"
        );
    }
    let (s, v) = serve
        .call(ann, Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(
        (s, v["state"].as_str()),
        (200, Some("running")),
        "the owner still has it: {v}"
    );
    let (_, listed) = serve.call(bob, Method::GET, "/v1/sessions", None).await;
    assert_eq!(listed["sessions"], json!([]), "bob lists nothing of ann's");
}

#[tokio::test]
async fn the_sessions_quota_answers_429_and_frees_up_when_one_ends() {
    let (serve, keys) = start(&[("cat", Some(1))]).await;
    let key = &keys[0];
    let id = serve.session(key).await;
    let (s, v) = serve
        .call(key, Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "sessions");
    let (s, _) = serve
        .call(key, Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    serve.session(key).await;
}

#[tokio::test]
async fn session_listings_page_by_cursor_without_repeats_or_gaps() {
    let (serve, keys) = start(&[("dee", Some(5))]).await;
    let key = &keys[0];
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(serve.session(key).await);
    }
    let mut seen = Vec::new();
    let mut path = "/v1/sessions?limit=2".to_string();
    loop {
        let (s, page) = serve.call(key, Method::GET, &path, None).await;
        assert_eq!(s, 200, "{page}");
        let rows = page["sessions"].as_array().unwrap();
        assert!(rows.len() <= 2, "{page}");
        seen.extend(rows.iter().map(|r| r["id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/sessions?limit=2&cursor={c}"),
            None => break,
        }
    }
    let (mut a, mut b) = (made.clone(), seen.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "every session once");
    let (s, v) = serve
        .call(key, Method::GET, "/v1/sessions?cursor=not-a-cursor", None)
        .await;
    assert_eq!(s, 400, "a forged cursor is bad input: {v}");
}
