//! Runs of several users in `sandboxd serve` (a real process, the real engine and image, a
//! fake LLM at the HTTP boundary): the admin's filter by user, each user seeing only their
//! own runs, and the daily token quota that stops a run and refuses the next.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{SERVER, follow_all, get_run, llm_config, start_run};
use serve::{Api, Env, code};
use support::fake_llm::{FakeLlm, Reply};

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_filters_runs_by_user_and_a_user_sees_only_their_own() {
    let llm = FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("ann", &[]);
    let bob = env.add_user("ben", &[]);
    let root = env.add_user("boss", &["--admin"]);
    let serve = env.start();
    let a = Api::new(&serve, &alice);
    let b = Api::new(&serve, &bob);
    let admin = Api::new(&serve, &root);
    let mut runs = Vec::new();
    for (api, task) in [(&a, "ann's first"), (&b, "ben's"), (&a, "ann's second")] {
        let run = start_run(api, json!({"task": task, "session": {}})).await;
        let id = run["id"].as_str().unwrap().to_string();
        follow_all(api, &id).await;
        runs.push(id);
    }
    let (ann_runs, ben_runs) = (
        vec![runs[2].clone(), runs[0].clone()],
        vec![runs[1].clone()],
    );
    // The ids the web UI's filter offers: GET /v1/users.
    let (s, users) = admin.json(Method::GET, "/v1/users", None).await;
    assert_eq!(s, 200, "{users}");
    let id_of = |name: &str| {
        users
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {users}"))["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (ann, ben) = (id_of("ann"), id_of("ben"));
    let ids = |v: &Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    let list = |api: &Api, q: String| {
        let api = api.clone();
        async move {
            let (s, v) = api.json(Method::GET, &format!("/v1/runs{q}"), None).await;
            assert_eq!(s, 200, "{q}: {v}");
            v
        }
    };

    // The admin: everyone's by default (also with an empty filter, the UI's "everyone"),
    // one user's with the filter, newest first, paged within it.
    let mut all = runs.clone();
    all.reverse();
    assert_eq!(ids(&list(&admin, String::new()).await), all);
    assert_eq!(ids(&list(&admin, "?owner=".into()).await), all);
    assert_eq!(ids(&list(&admin, format!("?owner={ann}")).await), ann_runs);
    assert_eq!(ids(&list(&admin, format!("?owner={ben}")).await), ben_runs);
    let page = list(&admin, format!("?owner={ann}&limit=1")).await;
    assert_eq!(ids(&page), ann_runs[..1]);
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let page = list(&admin, format!("?owner={ann}&limit=1&cursor={cursor}")).await;
    assert_eq!(ids(&page), ann_runs[1..]);
    assert!(page["next_cursor"].is_null(), "{page}");
    let v = list(&admin, format!("?owner={ann}&state=succeeded")).await;
    assert_eq!(ids(&v), ann_runs);
    assert!(ids(&list(&admin, "?owner=usr_nobody".into()).await).is_empty());

    // A user: their own, with or without their own id; another user's id lists nothing,
    // the same as an id nobody has.
    assert_eq!(ids(&list(&a, String::new()).await), ann_runs);
    assert_eq!(ids(&list(&a, format!("?owner={ann}")).await), ann_runs);
    for q in [format!("?owner={ben}"), "?owner=usr_nobody".into()] {
        let v = list(&a, q.clone()).await;
        assert!(ids(&v).is_empty(), "{q}: {v}");
        assert!(v["next_cursor"].is_null(), "{q}: {v}");
    }
    let v = list(&b, format!("?owner={ann}&limit=1")).await;
    assert!(ids(&v).is_empty(), "{v}");
    let (s, v) = b
        .json(Method::GET, &format!("/v1/runs/{}", runs[0]), None)
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // Nor can a user list the users to learn their ids.
    let (s, v) = a.json(Method::GET, "/v1/users", None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daily_token_quota_stops_a_run_and_refuses_the_next() {
    let llm = FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("bash", json!({"command": "echo again"})),
    )
    .await;
    let env = Env::new(&format!(
        "{}{SERVER}[quotas]\ninput_tokens_per_day = 50\n",
        llm_config(&llm)
    ))
    .await;
    let key = env.add_user("eve", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(
        &api,
        json!({"task": "loop forever", "session": {}, "max_steps": 50}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    let evs = follow_all(&api, &id).await;
    let v = get_run(&api, &id).await;
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["outcome"]["kind"], "quota_exceeded", "{v}");
    assert_eq!(v["outcome"]["quota"], "input_tokens_per_day");
    assert!(v["steps"].as_u64().unwrap() < 50);
    let fin = evs.iter().find(|e| e.event == "run_finished").unwrap();
    assert_eq!(fin.data["reason"]["kind"], "quota_exceeded");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "more", "session": {}})),
        )
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "input_tokens_per_day");
    assert_eq!(v["error"]["limit"], "50");
}

/// The admin's MCP servers (`[mcp] servers_file`) reach the service runs of the users
/// `[mcp] service_users` names: their tool is in the run's tool list and its call is a tool
/// event like any; a user the admin did not name gets no such tool.
#[tokio::test(flavor = "multi_thread")]
async fn a_serve_run_gets_the_admins_mcp_tools_only_for_allowed_users() {
    let dir = tempfile::tempdir().unwrap();
    let mcp_json = dir.path().join("mcp.json");
    let py = crate::mcp_common::python();
    let server = crate::mcp_common::script("server_sdk.py");
    std::fs::write(
        &mcp_json,
        json!({"mcpServers": {"team": {"command": py, "args": [server], "host": true}}})
            .to_string(),
    )
    .unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool("mcp_team_echo_text", json!({"text": "from serve"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "ann done"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "ben done"}),
        ),
    ])
    .await;
    let mcp = format!(
        "[mcp]\nservers_file = {:?}\nservice_users = [\"ann\"]\n",
        mcp_json.display().to_string()
    );
    let env = Env::new(&format!("{}{SERVER}{mcp}", llm_config(&llm))).await;
    let ann = env.add_user("ann", &[]);
    let ben = env.add_user("ben", &[]);
    let serve = env.start();
    let (a, b) = (Api::new(&serve, &ann), Api::new(&serve, &ben));

    let run = start_run(&a, json!({"task": "use the team tool", "session": {}})).await;
    let evs = follow_all(&a, run["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    let result = evs
        .iter()
        .find(|e| e.event == "tool_result" && e.data["name"] == "mcp_team_echo_text")
        .expect("the MCP tool's result is an event");
    assert_eq!(result.data["is_error"], false, "{}", result.data);
    assert!(
        result.data["output"]
            .as_str()
            .unwrap()
            .contains("echo: from serve")
    );

    let run = start_run(&b, json!({"task": "no team tool for you", "session": {}})).await;
    let evs = follow_all(&b, run["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs[0]["tools"].to_string().contains("mcp_team_echo_text"));
    let ben_tools = reqs[2]["tools"].to_string();
    assert!(!ben_tools.contains("mcp_team"), "{ben_tools}");
    assert!(
        ben_tools.contains("\"bash\""),
        "ben's run has the session's own tools"
    );
}
