//! Research end to end with the real binary, engine and image, every server local: an
//! agent run with the scripted fake LLM that searches, fetches two pages and writes a
//! self-contained report with python and jinja2 that comes out to the host citing the
//! fetched URLs; `sandboxd tool --list` / `sandboxd tool web_fetch`; and `doctor` saying
//! which engines answer.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};
use support::fake_web::FakeWeb;

/// The binary with a clean environment, its config `config` and its data under `cwd`.
fn sandboxd(cwd: &Path, config: &Path) -> Command {
    let mut cmd = support::cli::sandboxd(cwd);
    cmd.stdin(Stdio::null()).env("SANDBOXD_CONFIG", config);
    cmd
}

/// A config file whose research reaches only the fake web (127.0.0.1 on its port).
fn write_config(dir: &Path, web: &FakeWeb, engines: &str) -> PathBuf {
    let path = dir.join("sandboxd.toml");
    let text = format!(
        "[research]\nengines = {engines}\nsearxng_url = \"{}\"\nduckduckgo_url = \"{}\"\n\
         allow = [\"127.0.0.1\"]\nports = [80, 443, {}]\n",
        web.url("/searx/"),
        web.url("/ddg/"),
        web.port()
    );
    std::fs::write(&path, text).unwrap();
    path
}

const REPORT_PY: &str = r#"
import base64, glob, io, json, os, re
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from jinja2 import Template

sources = []
for p in sorted(glob.glob("/workspace/research/*.md")):
    text = open(p).read()
    head = text.split("---")[1]
    url = json.loads(re.search(r"^url: (.*)$", head, re.M).group(1))
    title = json.loads(re.search(r"^title: (.*)$", head, re.M).group(1))
    sources.append({"title": title, "url": url, "rain": "wettest month" in text})
fig, ax = plt.subplots(figsize=(4, 3))
ax.bar(["Jun", "Aug"], [230, 150])
buf = io.BytesIO()
fig.savefig(buf, format="png")
page = Template("""<!doctype html><html><head><meta charset="utf-8"><title>Kyoto rainfall</title></head>
<body><h1>Kyoto rainfall</h1><img alt="chart" src="data:image/png;base64,{{ img }}">
<h2>Sources</h2><ol>{% for s in sources %}<li><a href="{{ s.url }}">{{ s.title }}</a>{% if s.rain %} (rain data){% endif %}</li>{% endfor %}</ol>
</body></html>""").render(img=base64.b64encode(buf.getvalue()).decode(), sources=sources)
os.makedirs("/workspace/report", exist_ok=True)
open("/workspace/report/index.html", "w").write(page)
print(len(sources), "sources")
"#;

#[tokio::test]
async fn a_research_run_searches_fetches_and_leaves_a_cited_report_on_the_host() {
    let web = FakeWeb::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &web, "[\"searxng\"]");
    let (alpha, beta) = (web.url("/article/alpha"), web.url("/article/beta"));
    let llm = FakeLlm::start(vec![
        Reply::tool("web_search", json!({"query": "kyoto rainfall", "count": 5})),
        Reply::tool("web_fetch", json!({"url": alpha})),
        Reply::tool("web_fetch", json!({"url": beta})),
        Reply::tool("python", json!({"code": REPORT_PY})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "The report is in /workspace/report/index.html"}),
        ),
    ])
    .await;
    let out_dir = dir.path().join("out");
    let mut cmd = sandboxd(dir.path(), &config);
    cmd.env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model")
        .args(["run", "--json", "--no-input", "--output"])
        .arg(&out_dir)
        .args(["--prompt", "Research Kyoto's rainfall and write a report"]);
    let out = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);

    let report = std::fs::read_to_string(out_dir.join("report/index.html"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{stderr}"));
    for url in [&alpha, &beta] {
        assert!(
            report.contains(&format!("href=\"{url}\"")),
            "{url} not cited:\n{report}"
        );
    }
    assert_eq!(
        report.matches("(rain data)").count(),
        2,
        "the fetched text reached python"
    );
    assert!(
        report.contains("src=\"data:image/png;base64,iVBOR"),
        "embedded chart"
    );
    assert!(
        !report.contains("<script") && !report.contains("<link"),
        "self-contained"
    );
    // The research files came out too.
    let search: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("research/search-1.json")).unwrap())
            .unwrap();
    assert_eq!(search["results"][0]["url"], json!(alpha));
    assert!(out_dir.join("research/127-0-0-1-article-beta.md").is_file());
    let hits: Vec<String> = web.hits().into_iter().map(|(p, _)| p).collect();
    assert_eq!(hits, ["/searx/search", "/article/alpha", "/article/beta"]);

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    let system = reqs[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("NO network") && system.contains("web_fetch"),
        "{system}"
    );
    assert!(system.contains("/workspace/report/index.html"), "{system}");
    // The model saw the fetch's observation (preview and path).
    let seen = reqs[2].to_string();
    assert!(
        seen.contains("127-0-0-1-article-alpha.md") && seen.contains("wettest month"),
        "{seen}"
    );
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let fetched = events
        .iter()
        .filter(|e| {
            e["type"] == "tool_result" && e["name"] == "web_fetch" && e["is_error"] == false
        })
        .count();
    assert_eq!(fetched, 2);
    // Every request that left the host is in the run's events, with its outcome.
    let audited: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_result" && e["name"] == "web_fetch")
        .flat_map(|e| e["data"]["fetches"].as_array().into_iter().flatten())
        .collect();
    let ok = audited
        .iter()
        .filter(|f| {
            f["url"].as_str().is_some_and(|u| u.contains("127.0.0.1"))
                && f["status"] == 200
                && f["bytes"].as_u64().is_some_and(|b| b > 0)
        })
        .count();
    assert!(
        ok >= 2,
        "two fetched pages audited in the events: {audited:?}"
    );
}

#[tokio::test]
async fn the_cli_lists_and_runs_the_research_tools_and_doctor_names_the_engines() {
    let web = FakeWeb::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &web, "[\"duckduckgo\", \"searxng\", \"brave\"]");
    let list = sandboxd(dir.path(), &config)
        .args(["tool", "--list"])
        .output()
        .unwrap();
    let tools: Value = serde_json::from_slice(&list.stdout).unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"web_search") && names.contains(&"web_fetch"),
        "{names:?}"
    );

    let url = web.url("/article/cli");
    let run = tokio::process::Command::from({
        let mut c = sandboxd(dir.path(), &config);
        c.args([
            "tool",
            "--json",
            "web_fetch",
            &json!({ "url": url }).to_string(),
        ]);
        c
    })
    .output()
    .await
    .unwrap();
    let result: Value = serde_json::from_slice(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&run.stderr)));
    assert!(run.status.success(), "{result}");
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("Title: Article cli"),
        "{result}"
    );
    assert_eq!(result["data"]["fetches"][0]["url"], json!(url));

    web.set_captcha(true);
    let doctor = tokio::process::Command::from({
        let mut c = sandboxd(dir.path(), &config);
        c.arg("doctor");
        c
    })
    .output()
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.contains("ok    search engine searxng answers (2 results)"),
        "{text}"
    );
    assert!(
        text.contains("warn  search engine duckduckgo does not answer: blocked"),
        "{text}"
    );
    if std::env::var("BRAVE_API_KEY").is_err() {
        assert!(
            text.contains("info  search engine brave not configured: no key"),
            "{text}"
        );
    }
    assert!(
        text.contains("ok    web_search: 1 engine(s) answer"),
        "{text}"
    );
}
