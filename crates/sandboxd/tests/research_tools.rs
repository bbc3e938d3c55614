//! web_search and web_fetch through the registry, as the model calls them, on the real
//! engine and image, against local servers only (tests/support/fake_web.rs on 127.0.0.1,
//! admitted by an explicit test allow-list): SearXNG JSON, DuckDuckGo HTML and its
//! CAPTCHA page, fall-through on empty results, an article as Markdown that python in the
//! sandbox reads, PDFs and text saved as they are, the refusal of loopback without the
//! allow-list, quotas, and the switches that turn the tools off or onto the MCP server.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;

use sandboxd_core::config::Config;
use sandboxd_core::mcp::lazy::LazySandbox;
use sandboxd_core::research::ResearchConfig;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::session::{agent_tools, server_tools, session_tools};
use sandboxd_core::tools::{ToolContext, ToolRegistry, ToolResult};
use serde_json::{Value, json};
use support::fake_web::FakeWeb;

/// The research config of a test: the fake web's port allowed, its address on the allow-list.
fn research(web: &FakeWeb, engines: &[&str]) -> ResearchConfig {
    let mut r = ResearchConfig {
        engines: engines.iter().map(|s| s.to_string()).collect(),
        searxng_url: web.url("/searx/"),
        duckduckgo_url: web.url("/ddg/"),
        allow: vec!["127.0.0.1/32".into()],
        timeout_secs: 10,
        ..ResearchConfig::default()
    };
    r.ports.push(web.port());
    r
}

fn config_with(r: ResearchConfig) -> Config {
    let mut c = Config::load_with_env(None, &[]).unwrap();
    c.research = r;
    c
}

async fn call(reg: &ToolRegistry, name: &str, args: Value) -> ToolResult {
    reg.execute(name, &args.to_string(), &ToolContext::default())
        .await
        .unwrap_or_else(|e| panic!("{name} failed inside sandboxd: {e}"))
}

async fn python(reg: &ToolRegistry, code: &str) -> String {
    let r = call(reg, "python", json!({ "code": code })).await;
    assert!(!r.is_error(), "python: {}", r.render());
    r.output
}

fn fetched_urls(r: &ToolResult) -> Vec<String> {
    r.data.as_ref().expect("fetch records in data")["fetches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["url"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn searxng_results_are_normalised_saved_and_read_by_python() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let reg = session_tools(
        &s,
        &config_with(research(&web, &["searxng"])),
        Arc::new(NoHuman),
    );
    let r = call(
        &reg,
        "web_search",
        json!({"query": "kyoto rain", "count": 5, "language": "de", "region": "ch"}),
    )
    .await;
    assert!(!r.is_error(), "{}", r.render());
    // The duplicate (same URL with a fragment) and the javascript: result are gone.
    assert!(r.output.starts_with("2 results for \"kyoto rain\" (from searxng), saved to /workspace/research/search-1.json"), "{}", r.output);
    assert!(r.output.contains(&web.url("/article/alpha")) && r.output.contains("Beta snippet"));
    // Language and region reached the engine.
    let (_, q) = web
        .hits()
        .into_iter()
        .find(|(p, _)| p == "/searx/search")
        .unwrap();
    assert!(
        q.contains("format=json") && q.contains("language=de-CH"),
        "{q}"
    );
    assert_eq!(fetched_urls(&r).len(), 1);
    let out = python(
        &reg,
        "import json\nd = json.load(open('/workspace/research/search-1.json'))\n\
         print(d['engine'], [(h['rank'], h['engine']) for h in d['results']], d['region'])",
    )
    .await;
    assert_eq!(out.trim(), "searxng [(1, 'searxng'), (2, 'searxng')] ch");
    // The next search gets the next file.
    let r = call(&reg, "web_search", json!({"query": "again"})).await;
    assert!(r.output.contains("search-2.json"), "{}", r.output);
}

#[tokio::test]
async fn a_duckduckgo_captcha_cools_it_down_and_the_next_engine_answers() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let reg = session_tools(
        &s,
        &config_with(research(&web, &["duckduckgo", "searxng"])),
        Arc::new(NoHuman),
    );
    let r = call(
        &reg,
        "web_search",
        json!({"query": "kyoto", "region": "jp"}),
    )
    .await;
    assert!(r.output.contains("(from duckduckgo)"), "{}", r.output);
    assert!(
        r.output.contains("https://ddg-one.example/page"),
        "uddg decoded: {}",
        r.output
    );
    let form = web
        .hits()
        .into_iter()
        .find(|(p, _)| p == "/ddg/")
        .unwrap()
        .1;
    assert!(
        form.contains("q=kyoto") && form.contains("kl=jp-jp"),
        "{form}"
    );

    web.set_captcha(true);
    let r = call(&reg, "web_search", json!({"query": "kyoto"})).await;
    assert!(!r.is_error(), "{}", r.render());
    assert!(r.output.contains("(from searxng)"), "{}", r.output);
    assert!(
        r.output.contains("- duckduckgo: blocked: a CAPTCHA page"),
        "{}",
        r.output
    );

    // Cooling down: DuckDuckGo is not even asked now.
    let asked = web.hits().iter().filter(|(p, _)| p == "/ddg/").count();
    let r = call(&reg, "web_search", json!({"query": "kyoto"})).await;
    assert!(
        r.output.contains("- duckduckgo: cooling down for"),
        "{}",
        r.output
    );
    assert_eq!(
        web.hits().iter().filter(|(p, _)| p == "/ddg/").count(),
        asked
    );
}

#[tokio::test]
async fn empty_results_fall_through_and_no_results_is_an_answer() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let mut rc = research(&web, &["searxng", "duckduckgo"]);
    rc.cooldown_secs = 1;
    let reg = session_tools(&s, &config_with(rc), Arc::new(NoHuman));
    web.set_searx_empty(true);
    let r = call(&reg, "web_search", json!({"query": "nothing"})).await;
    assert!(r.output.contains("(from duckduckgo)"), "{}", r.output);
    assert!(r.output.contains("- searxng: no results"), "{}", r.output);

    web.set_captcha(true);
    let r = call(&reg, "web_search", json!({"query": "nothing"})).await;
    assert!(!r.is_error(), "no results is an answer: {}", r.render());
    assert!(
        r.output.starts_with("No results for \"nothing\""),
        "{}",
        r.output
    );
    let out = python(
        &reg,
        "import json\nd = json.load(open('/workspace/research/search-2.json'))\nprint(d['results'], len(d['failed_engines']))",
    )
    .await;
    assert_eq!(out.trim(), "[] 2");

    // After its (one-second) cool-down DuckDuckGo is asked again.
    web.set_captcha(false);
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let r = call(&reg, "web_search", json!({"query": "nothing"})).await;
    assert!(r.output.contains("(from duckduckgo)"), "{}", r.output);
}

#[tokio::test]
async fn an_article_becomes_markdown_with_absolute_links_that_python_reads() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let reg = session_tools(
        &s,
        &config_with(research(&web, &["searxng"])),
        Arc::new(NoHuman),
    );
    let url = web.url("/article/alpha");
    let r = call(&reg, "web_fetch", json!({"url": url, "save_raw": true})).await;
    assert!(!r.is_error(), "{}", r.render());
    let path = "/workspace/research/127-0-0-1-article-alpha.md";
    assert!(r.output.contains(&format!("→ {path}")), "{}", r.output);
    assert!(r.output.contains("Title: Article alpha") && r.output.contains("readability"));
    assert!(
        r.output.contains("wettest month"),
        "a preview: {}",
        r.output
    );
    let record = &r.data.as_ref().unwrap()["fetches"][0];
    assert_eq!(record["status"], 200);
    assert_eq!(record["final_url"], json!(url));
    let base = web.url("/article/");
    let out = python(
        &reg,
        &format!(
            "t = open('{path}').read()\n\
             head = t.split('---')[1]\n\
             print('url: \"{url}\"' in head, 'status: \"200\"' in head, 'fetched_at:' in head)\n\
             print('({base}alpha-data)' in t, '({base}details.html)' in t, 'About us' in t)\n\
             print(len(open('/workspace/research/127-0-0-1-article-alpha.raw.html').read()) > 500)"
        ),
    )
    .await;
    assert_eq!(out.trim(), "True True True\nTrue True False\nTrue", "{out}");
    // A second fetch of the same page does not overwrite the first.
    let r = call(&reg, "web_fetch", json!({"url": url})).await;
    assert!(
        r.output.contains("127-0-0-1-article-alpha-2.md"),
        "{}",
        r.output
    );
}

#[tokio::test]
async fn pdfs_and_text_are_saved_as_they_are_and_errors_save_nothing() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let reg = session_tools(
        &s,
        &config_with(research(&web, &["searxng"])),
        Arc::new(NoHuman),
    );
    let r = call(&reg, "web_fetch", json!({"url": web.url("/paper.pdf")})).await;
    assert!(
        r.output.contains("127-0-0-1-paper-pdf.pdf") && r.output.contains("pypdf"),
        "{}",
        r.output
    );
    let bytes = s
        .sandbox
        .read_file("/workspace/research/127-0-0-1-paper-pdf.pdf")
        .await
        .unwrap();
    assert_eq!(bytes, support::fake_web::PDF);
    let r = call(&reg, "web_fetch", json!({"url": web.url("/notes.txt")})).await;
    assert!(r.output.contains("plain notes"), "{}", r.output);
    let text = s
        .sandbox
        .read_file("/workspace/research/127-0-0-1-notes-txt.txt")
        .await
        .unwrap();
    assert_eq!(text, b"plain notes\nline 2\n");
    let r = call(&reg, "web_fetch", json!({"url": web.url("/missing")})).await;
    assert!(
        r.is_error() && r.render().contains("HTTP 404"),
        "{}",
        r.render()
    );
    let r = call(&reg, "web_fetch", json!({"url": web.url("/binary")})).await;
    assert!(r.render().contains("`content-type` rule"), "{}", r.render());
    let listing = python(
        &reg,
        "import os\nprint(sorted(os.listdir('/workspace/research')))",
    )
    .await;
    assert_eq!(
        listing.trim(),
        "['127-0-0-1-notes-txt.txt', '127-0-0-1-paper-pdf.pdf']",
        "nothing saved for the 404 or the binary"
    );
}

#[tokio::test]
async fn a_model_url_cannot_reach_loopback_without_the_allow_list() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let mut rc = research(&web, &["searxng"]);
    rc.allow.clear();
    let reg = session_tools(&s, &config_with(rc), Arc::new(NoHuman));
    let r = call(
        &reg,
        "web_fetch",
        json!({"url": web.url("/article/secret")}),
    )
    .await;
    assert!(r.is_error(), "{}", r.render());
    let text = r.render();
    assert!(
        text.contains("`denied-address` rule") && text.contains("loopback"),
        "{text}"
    );
    assert!(
        text.contains("[research] allow"),
        "says what the admin could do: {text}"
    );
    assert_eq!(
        r.data.as_ref().unwrap()["fetches"][0]["refused"],
        "denied-address"
    );
    // Nothing the model sends can widen the rules: there is no such argument.
    let r = call(
        &reg,
        "web_fetch",
        json!({"url": web.url("/article/secret"), "allow": ["127.0.0.1"]}),
    )
    .await;
    assert!(
        r.render().contains("unknown parameter \"allow\""),
        "{}",
        r.render()
    );
    assert!(
        web.hits().is_empty(),
        "the server was reached: {:?}",
        web.hits()
    );
}

#[tokio::test]
async fn quotas_stop_a_run_with_a_readable_error() {
    let web = FakeWeb::start().await;
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let mut rc = research(&web, &["searxng"]);
    rc.fetches_per_run = 1;
    rc.searches_per_run = 0;
    let reg = session_tools(&s, &config_with(rc), Arc::new(NoHuman));
    assert!(
        !call(&reg, "web_fetch", json!({"url": web.url("/notes.txt")}))
            .await
            .is_error()
    );
    let r = call(&reg, "web_fetch", json!({"url": web.url("/notes.txt")})).await;
    assert!(
        r.render()
            .contains("quota reached: 1 of 1 fetches in this run"),
        "{}",
        r.render()
    );
    let r = call(&reg, "web_search", json!({"query": "x"})).await;
    assert!(r.render().contains("searches_per_run"), "{}", r.render());
}

#[tokio::test]
async fn research_is_on_by_default_off_by_switch_and_on_mcp_only_when_asked() {
    let m = support::manager().await;
    let lazy = LazySandbox::new(
        m.clone(),
        sandboxd_core::sandbox::Owner::new("test").unwrap(),
    );
    let names = |c: &Config| {
        agent_tools(lazy.clone(), &c.limits, c, Arc::new(NoHuman), None)
            .registry
            .names()
    };
    let default = Config::load_with_env(None, &[]).unwrap();
    let n = names(&default);
    assert!(
        n.contains(&"web_fetch".into()) && n.contains(&"web_search".into()),
        "{n:?}"
    );
    // Without any engine web_search is left out, web_fetch stays.
    let mut no_engines = default.clone();
    no_engines.research.engines = vec!["brave".into()];
    no_engines.research.brave_api_key.clear();
    if std::env::var("BRAVE_API_KEY").is_err() {
        let n = names(&no_engines);
        assert!(
            n.contains(&"web_fetch".into()) && !n.contains(&"web_search".into()),
            "{n:?}"
        );
    }
    let off = Config::load_with_env(
        None,
        &[("SANDBOXD_RESEARCH_ENABLED".into(), "false".into())],
    )
    .unwrap();
    let n = names(&off);
    assert!(!n.iter().any(|t| t.starts_with("web_")), "{n:?}");
    let server = |c: &Config| server_tools(lazy.clone(), &c.limits, c).names();
    assert!(!server(&default).iter().any(|t| t.starts_with("web_")));
    let mut mcp = default.clone();
    mcp.research.mcp = true;
    assert!(server(&mcp).contains(&"web_fetch".into()));
    let mut mcp_off = mcp.clone();
    mcp_off.research.enabled = false;
    assert!(!server(&mcp_off).iter().any(|t| t.starts_with("web_")));
}
