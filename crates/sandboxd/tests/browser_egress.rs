//! browser_use and the session's egress, on the real engine, image and Chromium: URLs of
//! other hosts refused by the policy's rule before Chromium is asked, an allowed one handed
//! to Chromium, which reaches for the egress proxy its command line names (no proxy runs in
//! these tests, so the load fails and the action says so), the sandbox's own servers still
//! loading directly, downloads landing in /workspace, and the web_search action opening the
//! first result the policy allows. The live web through a running proxy is in
//! browser_live_web.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::browser_support;
use crate::support;

use std::sync::Arc;
use std::time::Duration;

use browser_support::*;
use sandboxd_core::config::Config;
use sandboxd_core::egress::{EgressPolicy, FixedPolicy};
use sandboxd_core::research::{Research, ResearchConfig};
use sandboxd_core::sandbox::{Sandbox, ShellOptions};
use sandboxd_core::tools::browser::{BrowserUse, Egress};
use sandboxd_core::tools::session::{SessionTools, ToolOptions, server_tools};
use sandboxd_core::tools::{Tool, ToolContext};
use serde_json::json;
use support::fake_web::FakeWeb;

fn egress(policy: &str) -> Egress {
    let policy = EgressPolicy::parse(policy).unwrap();
    Egress {
        source: Arc::new(FixedPolicy(policy.clone())),
        at_start: policy,
        chromium_args: Default::default(),
    }
}

/// The command lines of the sandbox's processes.
async fn processes(sb: &dyn Sandbox) -> String {
    let opts = ShellOptions {
        timeout: Duration::from_secs(20),
        ..ShellOptions::default()
    };
    let out = sb.shell("ps -eo args", opts).await.unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr_lossy());
    out.stdout_lossy()
}

#[tokio::test]
async fn urls_of_other_hosts_are_refused_by_the_rule_before_chromium_starts() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;

    // Egress off (no policy: as every browser was before egress).
    let off = BrowserUse::new(s.sandbox.clone());
    assert!(
        off.description().contains("NO network"),
        "{}",
        off.description()
    );
    for action in ["go_to_url", "open_tab"] {
        let r = call(
            &off,
            json!({"action": action, "url": "https://example.com/"}),
        )
        .await;
        let e = r.error.clone().expect("refused");
        assert!(e.contains("rule \"egress off\""), "{e}");
        assert!(e.contains("PUT /v1/sessions/{id}/egress"), "{e}");
        assert!(e.contains("--egress"), "{e}");
    }
    // A policy that does not allow the host: the rule and what it allows.
    let narrow = BrowserUse::new(s.sandbox.clone())
        .with_egress(egress("allowed.example,!ads.allowed.example"));
    assert!(
        narrow
            .description()
            .contains("now: allowed.example, !ads.allowed.example"),
        "{}",
        narrow.description()
    );
    let r = call(
        &narrow,
        json!({"action": "go_to_url", "url": "https://other.example/x"}),
    )
    .await;
    let e = r.error.unwrap();
    assert!(
        e.contains("refuses other.example (rule \"not in the allowlist\""),
        "{e}"
    );
    assert!(
        e.contains("the policy allows: allowed.example, !ads.allowed.example"),
        "{e}"
    );
    let r = call(
        &narrow,
        json!({"action": "open_tab", "url": "http://ads.allowed.example/"}),
    )
    .await;
    assert!(r.error.unwrap().contains("rule \"!ads.allowed.example\""));
    // Refused before anything started: no Chromium, no state.
    assert!(off.current_state().await.is_none());
    assert!(narrow.current_state().await.is_none());
    assert!(!processes(s.sandbox.as_ref()).await.contains("chromium"));

    // The session's tools carry the egress they were built with into the browser.
    let config = Config::load_with_env(None, &[]).unwrap();
    let tools = SessionTools::of_with(&s, &config, || ToolOptions {
        egress: Some(egress("a.example,*.b.example")),
    });
    assert!(
        tools
            .browser
            .description()
            .contains("now: a.example, *.b.example"),
        "{}",
        tools.browser.description()
    );

    // The MCP server without `[research] mcp`: the browser's web_search (a host-side
    // search) is off there too; with it, the browser has it.
    let mut config = Config::load_with_env(None, &[]).unwrap();
    config.research.mcp = false;
    let reg = server_tools(s.sandbox.clone(), &s.limits, &config);
    let browser = reg.get("browser_use").unwrap();
    assert!(
        !browser.description().contains("web_search"),
        "{}",
        browser.description()
    );
    let r = reg
        .execute(
            "browser_use",
            &json!({"action": "web_search", "query": "x"}).to_string(),
            &ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(r.error.unwrap().contains("[research] mcp = false"));
    config.research.mcp = true;
    let reg = server_tools(s.sandbox.clone(), &s.limits, &config);
    assert!(
        reg.get("browser_use")
            .unwrap()
            .description()
            .contains("web_search(query)")
    );
}

#[tokio::test]
async fn an_allowed_host_goes_to_the_proxy_and_the_sandboxs_own_servers_stay_direct() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    serve_site(s.sandbox.as_ref()).await;
    let tool = BrowserUse::new(s.sandbox.clone()).with_egress(egress("allowed.example"));

    // Allowed: Chromium is asked, and reaches for the proxy, which is not running here.
    let r = call(
        &tool,
        json!({"action": "go_to_url", "url": "http://allowed.example/page"}),
    )
    .await;
    let e = r.error.clone().expect("the load fails without a proxy");
    assert!(
        e.contains("could not load \"http://allowed.example/page\""),
        "{e}"
    );
    assert!(e.contains("ERR_PROXY_CONNECTION_FAILED"), "{e}");
    assert!(e.contains("egress proxy is not running"), "{e}");
    assert!(!r.output.contains("Navigated"), "{}", r.output);
    let ps = processes(s.sandbox.as_ref()).await;
    assert!(
        ps.lines()
            .any(|l| l.contains("chromium") && l.contains("--proxy-server=http://127.0.0.1:3128")),
        "{ps}"
    );

    // The sandbox's own server loads directly, proxy or not.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/index.html"}),
    )
    .await;
    assert!(r.output.contains("Title: \"Home page\""), "{}", r.output);
    let r = ok(
        &tool,
        json!({"action": "open_tab", "url": "http://127.0.0.1:8000/page2.html"}),
    )
    .await;
    assert!(r.output.contains("Title: \"Page two\""), "{}", r.output);
}

#[tokio::test]
async fn a_navigation_that_downloads_lands_in_the_workspace_and_the_tab_carries_on() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    serve_site(s.sandbox.as_ref()).await;
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    // http.server serves .bin as application/octet-stream: Chromium downloads it.
    s.sandbox
        .write_file(&format!("{SITE}/report.bin"), &body)
        .await
        .unwrap();
    let tool = BrowserUse::new(s.sandbox.clone());
    ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/index.html"}),
    )
    .await;

    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/report.bin"}),
    )
    .await;
    assert!(
        r.output.contains("is a download, not a page"),
        "{}",
        r.output
    );
    assert!(
        r.output
            .contains("downloaded \"/workspace/report.bin\" (5000 bytes)"),
        "{}",
        r.output
    );
    // The tab shows the page it showed before.
    assert!(
        r.output.contains("The tab shows the page it showed before"),
        "{}",
        r.output
    );
    assert!(r.output.contains("Title: \"Home page\""), "{}", r.output);
    assert!(
        r.output.contains("tab 0 (current)") && !r.output.contains("tab 1"),
        "{}",
        r.output
    );
    assert_eq!(
        s.sandbox.read_file("/workspace/report.bin").await.unwrap(),
        body
    );

    // The next navigation of the tab is not held behind the one the download cut short.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/page2.html"}),
    )
    .await;
    assert!(r.output.contains("Title: \"Page two\""), "{}", r.output);
    // A second download of the same name does not overwrite the first.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/report.bin"}),
    )
    .await;
    let names: Vec<String> = s
        .sandbox
        .list_dir("/workspace")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.starts_with("report"))
        .collect();
    assert_eq!(names.len(), 2, "{names:?}\n{}", r.output);
    // Nothing of the staging is left in the workspace.
    assert!(
        s.sandbox
            .stat("/workspace/.sandboxd-downloads")
            .await
            .is_err(),
        "the staging directory is left behind"
    );
    assert_eq!(
        s.sandbox.read_file("/workspace/report.bin").await.unwrap(),
        body
    );
    let second = names.iter().find(|n| *n != "report.bin").unwrap();
    assert!(
        r.output
            .contains(&format!("downloaded \"/workspace/{second}\" (5000 bytes)")),
        "{names:?}\n{}",
        r.output
    );
}

/// The research config of the web_search tests: the fake DuckDuckGo, on the allow-list.
fn research(web: &FakeWeb) -> ResearchConfig {
    let mut r = ResearchConfig {
        engines: vec!["duckduckgo".into()],
        duckduckgo_url: web.url("/ddg/"),
        allow: vec!["127.0.0.1/32".into()],
        timeout_secs: 10,
        ..ResearchConfig::default()
    };
    r.ports.push(web.port());
    r
}

#[tokio::test]
async fn web_search_opens_the_first_result_the_policy_allows() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let rc = research(&web);

    // The fake engine answers [ddg-one.example, ddg-two.example]; only the second is allowed.
    let tool = BrowserUse::new(s.sandbox.clone())
        .with_egress(egress("ddg-two.example"))
        .with_research(Research::new(&rc, "tester"));
    let r = call(&tool, json!({"action": "web_search", "query": "kyoto"})).await;
    let e = r.error.clone().expect("opening fails: no proxy runs here");
    assert!(
        e.starts_with("2 results for \"kyoto\" (from duckduckgo):"),
        "{e}"
    );
    assert!(
        e.contains("1. \"DDG one\" \"https://ddg-one.example/page\" [refused: rule \"not in the allowlist\"]"),
        "{e}"
    );
    assert!(
        e.contains("2. \"DDG two\" \"https://ddg-two.example/\" [opened]"),
        "{e}"
    );
    // It went to Chromium, which reached for the proxy.
    assert!(
        e.contains("could not load \"https://ddg-two.example/\""),
        "{e}"
    );
    assert!(e.contains("ERR_PROXY_CONNECTION_FAILED"), "{e}");
    assert!(
        web.hits()
            .iter()
            .any(|(p, q)| p == "/ddg/" && q.contains("q=kyoto"))
    );

    // Nothing allowed: nothing opened, the results and what to do instead.
    let none = BrowserUse::new(s.sandbox.clone()).with_research(Research::new(&rc, "tester"));
    let r = call(&none, json!({"action": "web_search", "query": "kyoto"})).await;
    let e = r.error.unwrap();
    assert!(e.contains("[refused: rule \"egress off\"]"), "{e}");
    assert!(e.contains("No result was opened: egress is off"), "{e}");
    assert!(e.contains("web_fetch"), "{e}");
    assert!(none.current_state().await.is_none());

    // Without engines it says so.
    let bare = BrowserUse::new(s.sandbox.clone());
    let r = call(&bare, json!({"action": "web_search", "query": "kyoto"})).await;
    assert!(r.error.unwrap().contains("no search engine"));
}
