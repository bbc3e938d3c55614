//! Usage metering on a real serve (real engine and image, a scripted fake LLM), sampling
//! every second: a session that burns 2 CPU-seconds (a busy loop under its CPU limit)
//! reports between 1.5 and 2.5; the bytes of a file uploaded and read back, the tokens of a
//! run (exactly the fake LLM's `usage`, under the configured model) and its tool calls are
//! counted; the days sum to the sessions; another user cannot read it (404) and sees none of
//! it in their own; an admin reads it by name, everyone's, and as CSV; `sandboxd users
//! usage` prints the same day. The admin page shows it in a real browser: a row per user
//! and a chart of 30 days.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{ended_run, follow_all, llm_config, start_run};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Reply};

/// Burns exactly 2 s of its own CPU time (not wall time: the limit may slow it).
const BURN: &str = "python3 -c 'import time\nwhile time.process_time() < 2.0: pass'";

async fn usage(api: &Api, query: &str) -> (u16, Value) {
    api.json(Method::GET, &format!("/v1/usage{query}"), None)
        .await
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The sum of a field over usage rows.
fn total(rows: &Value, k: &str) -> f64 {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| f(&r["usage"], k))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_cpu_tokens_and_bytes_are_metered_and_private() {
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "echo hi"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    // Inside [sessions] (Env's own), then the LLM's table.
    let env = Env::new(&format!(
        "usage_sample_secs = 1\n[pool]\nsize = 0\n{}",
        llm_config(&llm)
    ))
    .await;
    let root_key = env.add_user("root", &["--admin"]);
    let ann_key = env.add_user("ann", &[]);
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let root = Api::new(&serve, &root_key);
    let ann = Api::new(&serve, &ann_key);
    let bob = Api::new(&serve, &bob_key);

    let id = ann.session().await;
    let out = ann.exec(&id, BURN).await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let data = vec![b'x'; 1000];
    let r = ann
        .req(
            Method::PUT,
            &format!("/v1/sessions/{id}/files/content?path=/workspace/a.bin"),
        )
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = ann
        .req(
            Method::GET,
            &format!("/v1/sessions/{id}/files/content?path=/workspace/a.bin"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..]);
    // A tool called directly counts as one, as a run's do.
    let (s, v) = ann
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/bash"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let run = start_run(&ann, json!({"task": "say hi", "session_id": id})).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let run = ended_run(&ann, &run_id).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let tool_calls = follow_all(&ann, &run_id)
        .await
        .iter()
        .filter(|e| e.event == "tool_call")
        .count();
    assert_eq!(tool_calls, 2, "bash, then terminate");
    // Its end takes the last reading before its container goes.
    let (s, _) = ann
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);

    let (s, mine) = usage(&ann, "").await;
    assert_eq!(s, 200, "{mine}");
    let sessions = mine["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{mine:#}");
    let session = &sessions[0];
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(session["user"], "ann");
    let u = &session["usage"];
    let cpu = f(u, "cpu_seconds");
    assert!(
        (1.5..=2.5).contains(&cpu),
        "2 CPU-seconds burnt, {cpu} metered: {u}"
    );
    assert!(f(u, "memory_gib_seconds") > 0.0, "{u}");
    assert!(
        f(u, "wall_seconds") >= 2.0,
        "alive at least as long as it burnt: {u}"
    );
    assert_eq!(
        (u["bytes_in"].as_u64(), u["bytes_out"].as_u64()),
        (Some(1000), Some(1000)),
        "{u}"
    );
    assert_eq!(
        u["tool_calls"].as_u64(),
        Some(3),
        "the run's two and the direct one: {u}"
    );
    let spent = &run["usage"];
    assert!(spent["prompt_tokens"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(
        u["tokens"],
        json!([{
            "model": "fake-model",
            "tokens_in": spent["prompt_tokens"],
            "tokens_out": spent["completion_tokens"],
        }]),
        "the fake LLM's usage, under the configured model"
    );

    // The days sum to the sessions, and are ann's alone.
    let days = &mine["days"];
    assert!(
        days.as_array().unwrap().iter().all(|d| d["user"] == "ann"),
        "{mine:#}"
    );
    for k in [
        "cpu_seconds",
        "memory_gib_seconds",
        "wall_seconds",
        "bytes_in",
        "bytes_out",
        "tool_calls",
    ] {
        let (by_days, by_sessions) = (total(days, k), total(&mine["sessions"], k));
        assert!(
            (by_days - by_sessions).abs() < 1e-6,
            "{k}: {by_days} vs {by_sessions}"
        );
    }
    let day_tokens: u64 = days
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["usage"]["tokens"].as_array().unwrap().clone())
        .map(|t| t["tokens_in"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(day_tokens), spent["prompt_tokens"].as_u64());

    // Bob: ann's is 404 (like a user that does not exist), his own holds none of it.
    for q in ["?user=ann", "?user=root", "?user=nobody"] {
        let (s, v) = usage(&bob, q).await;
        assert_eq!(s, 404, "{q}: {v}");
    }
    let (s, his) = usage(&bob, "?user=bob").await;
    assert_eq!(s, 200);
    assert_eq!(his["days"], json!([]), "{his}");
    assert_eq!(his["sessions"], json!([]), "{his}");
    let (s, v) = usage(&bob, "?days=0").await;
    assert_eq!(s, 400, "{v}");

    // The admin: by name, everyone's, and as CSV.
    let (s, by_name) = usage(&root, "?user=ann").await;
    assert_eq!(s, 200);
    assert_eq!(by_name["sessions"], mine["sessions"]);
    let (_, everyone) = usage(&root, "").await;
    assert_eq!(
        everyone["sessions"], mine["sessions"],
        "only ann used anything"
    );
    let r = root
        .req(Method::GET, "/v1/usage?format=csv")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let csv = r.text().await.unwrap();
    let mut lines = csv.lines();
    assert!(
        lines.next().unwrap().starts_with("day,user,cpu_seconds,"),
        "{csv}"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), days.as_array().unwrap().len(), "{csv}");
    assert!(
        rows.iter().all(|r| r.split(',').nth(1) == Some("ann")),
        "{csv}"
    );

    // The CLI on the host reads the same store.
    let out = env
        .cmd()
        .args(["users", "usage", "ann", "--csv"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli = String::from_utf8(out.stdout).unwrap();
    assert_eq!(cli.lines().count(), rows.len() + 1, "{cli}");
    assert!(
        cli.lines()
            .skip(1)
            .all(|l| l.split(',').nth(1) == Some("ann")),
        "{cli}"
    );
}

/// The admin page's usage table and chart, in a real browser: a user's bytes show in their
/// row, and the chart has a bar per day of the last 30, today's the one that is not empty.
#[tokio::test]
async fn the_admin_page_shows_each_users_usage_and_a_chart_of_30_days() {
    use crate::web_ui::sign_in;
    use std::time::Duration;
    use support::web_browser::{WebBrowser, eval, goto, wait_for};

    let env = Env::new("").await;
    let root_key = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let id = bob.session().await;
    let out = bob.exec(&id, BURN).await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let r = bob
        .req(
            Method::PUT,
            &format!("/v1/sessions/{id}/files/content?path=/workspace/b.bin"),
        )
        .body(vec![b'y'; 1234])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, _) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &root_key).await;
    goto(&page, &serve.url("/admin")).await;
    wait_for(
        &page,
        "document.querySelector('#usage tr[data-user=bob]') !== null",
        Duration::from_secs(20),
        "bob in the usage table",
    )
    .await;
    let row = eval(
        &page,
        "Array.from(document.querySelectorAll('#usage tr[data-user=bob] td')).map((t) => t.textContent)",
    )
    .await;
    let cells: Vec<&str> = row
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cells[0], "bob");
    let cpu: f64 = cells[1].replace(',', "").parse().unwrap();
    assert!((1.5..=2.5).contains(&cpu), "{cells:?}");
    assert!(
        cells[4].starts_with("1,234 / ") || cells[4].starts_with("1234 / "),
        "{cells:?}"
    );
    let bars = eval(
        &page,
        "Array.from(document.querySelectorAll('#usage tr[data-user=bob] svg.spark rect')).map((r) => Number(r.getAttribute('height')))",
    )
    .await;
    let bars: Vec<f64> = bars
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect();
    assert_eq!(bars.len(), 30, "a bar per day");
    assert_eq!(bars[29], 32.0, "today's is the busiest: {bars:?}");
    assert!(bars[..29].iter().all(|b| *b == 0.0), "{bars:?}");
    assert!(
        eval(
            &page,
            "document.querySelector('#usage tr[data-user=root]') === null"
        )
        .await
        .as_bool()
        .unwrap(),
        "root used nothing, so has no row"
    );
}

/// Tools called over /mcp count in the usage of the MCP sandbox's session (its row).
#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_over_mcp_count_in_their_sessions_usage() {
    use crate::serve_mcp_quota::client::{Cleanup, Mcp, mcp_containers};

    let env = Env::new("").await;
    let key = env.add_user("cal", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let mut cleanup = Cleanup(Vec::new());
    let m = Mcp::open(&serve, &key).await;
    m.bash("true", None).await;
    m.bash("echo two", None).await;
    cleanup.0.extend(mcp_containers(&env, &api).await);
    assert_eq!(m.delete(None).await, 202);

    let (s, mine) = usage(&api, "").await;
    assert_eq!(s, 200, "{mine}");
    let sessions = mine["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{mine:#}");
    let u = &sessions[0]["usage"];
    assert_eq!(u["tool_calls"].as_u64(), Some(2), "{mine:#}");
    assert_eq!(total(&mine["days"], "tool_calls"), 2.0, "{mine:#}");
}
