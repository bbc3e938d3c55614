//! An agent run through `serve` on the live web (issue 24), with the scripted fake LLM: the
//! browser's `web_search` asks the host-side engine (a local SearXNG), opens the first result
//! the session's allowlist allows in Chromium through the session's egress proxy, the page's
//! JavaScript writes a code word, `extract_content` reads it and the final answer reports it.
//! The code word is in no script and no request of the test: the fake LLM's last two replies
//! are built from what the run showed it, so the answer has it only if the page was loaded
//! and read. The run's events carry the egress audit of the page's connection.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::net::IpAddr;

use crate::egress::support::host_address;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use serve::runs::{SERVER, follow_all, get_run, llm_config, start_run};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Reply};

/// The page: its code word exists only once its script has run (split in the source).
const PAGE: &str = "<!doctype html><html><head><title>Field notes</title></head><body>\
    <h1>Field notes</h1><p id=w>loading</p><script>document.getElementById('w').textContent = \
    'The code word is ' + ['QUOKKA', 'LANTERN'].join('-') + '-' + (6 * 7);</script></body></html>";
const WORD: &str = "QUOKKA-LANTERN-42";

/// A tiny web on `addr`: `/searx/search` answers as SearXNG (a result on a host the policy
/// refuses, then the page), anything else is the page.
async fn web(addr: IpAddr) -> u16 {
    let listener = tokio::net::TcpListener::bind((addr, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let (ct, body) = if text.starts_with("GET /searx/search") {
                    let results = json!({"query": "q", "results": [
                        {"url": "https://elsewhere.example/notes", "title": "Elsewhere", "content": "refused", "engine": "x"},
                        {"url": format!("http://{addr}:{port}/notes"), "title": "Field notes", "content": "the notes", "engine": "x"},
                    ]});
                    ("application/json", results.to_string())
                } else {
                    ("text/html; charset=utf-8", PAGE.to_string())
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    port
}

/// The text after "code word is " in whatever the request showed the model, or "nothing".
fn word_in(body: &Value) -> String {
    let text = body.to_string();
    text.split("code word is ")
        .nth(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .unwrap_or_else(|| "nothing".into())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_searches_opens_the_allowed_result_through_the_proxy_and_reports_the_page() {
    let addr = host_address();
    let port = web(addr).await;
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "browser_use",
            json!({"action": "web_search", "query": "field notes"}),
        ),
        Reply::tool(
            "browser_use",
            json!({"action": "extract_content", "goal": "the code word"}),
        ),
        // The extraction request: the forced call, with what the page (as Markdown) says.
        Reply::FromRequest(|body| {
            Reply::tool(
                "extract_content",
                json!({"extracted_content": {"text": format!("code word is {}", word_in(body))}}),
            )
        }),
        // The report: what the extraction's observation said.
        Reply::FromRequest(|body| {
            Reply::tool(
                "terminate",
                json!({"status": "success", "answer": format!("The page's code word is {}.", word_in(body))}),
            )
        }),
    ])
    .await;
    let env = Env::new(&format!(
        "{}{SERVER}[research]\nengines = [\"searxng\"]\nsearxng_url = \"http://{addr}:{port}/searx/\"\n\
         allow = [\"{addr}\"]\nports = [80, 443, {port}]\n[egress]\nwidest = \"any\"\n",
        llm_config(&llm)
    ))
    .await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(
        &api,
        json!({"task": "Find the field notes and tell me their code word", "session": {"egress": [addr.to_string()]}}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let events = follow_all(&api, &id).await;
    let v = get_run(&api, &id).await;
    assert_eq!(v["state"], "succeeded", "{v}\n{events:#?}");
    let answer = v["answer"].as_str().unwrap_or_default();
    assert!(answer.contains(WORD), "{answer}\n{events:#?}");
    assert_eq!(llm.requests().len(), 4, "{events:#?}");

    // The search result on a host the policy refuses was listed, not opened.
    let search = events
        .iter()
        .find(|e| e.event == "tool_result" || e.data.to_string().contains("[opened]"))
        .map(|e| e.data.to_string())
        .unwrap_or_default();
    assert!(search.contains("[refused: rule"), "{events:#?}");
    // The page's connection is in the run's events: allowed by the session's rule.
    let host = addr.to_string();
    let egress: Vec<&Value> = events
        .iter()
        .filter(|e| e.event == "egress")
        .map(|e| &e.data)
        .collect();
    let page = egress
        .iter()
        .map(|d| {
            if d["record"].is_object() {
                &d["record"]
            } else {
                *d
            }
        })
        .find(|r| r["host"] == host.as_str() && r["port"] == port)
        .unwrap_or_else(|| panic!("no egress event for {host}:{port}: {egress:#?}"));
    assert_eq!(page["allowed"], true, "{page}");
    assert_eq!(page["rule"], host.as_str(), "{page}");
    assert!(page["bytes_down"].as_u64().unwrap() > 0, "{page}");
    // The refused result was never connected to: no record names it.
    assert!(
        !egress
            .iter()
            .any(|d| d.to_string().contains("elsewhere.example")),
        "{egress:#?}"
    );
    // And the session's own view keeps the record too.
    let (s, e) = api
        .json(Method::GET, &format!("/v1/sessions/{session}/egress"), None)
        .await;
    assert_eq!(s, 200, "{e}");
    assert!(
        e["recent"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["host"] == host.as_str() && r["allowed"] == true),
        "{e}"
    );
}
