//! The run view in a real browser (Debian's chromium) against a real `sandboxd serve`, the
//! real engine and image and the scripted fake LLM: coloured bash output, a python plot and
//! a browser screenshot in their cards, a reload mid-run without duplicates, hostile model
//! text and terminal escapes that run nothing, Stop during a long tool call, ask_human
//! answered in the page, a follow-up in the same session, and another user's run as "not
//! found". Screenshots land in target/ui-artifacts/.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve};
use support::fake_llm::{FakeLlm, Reply, last_of_role};
use support::web_browser::{
    WebBrowser, click, eval, goto, screenshot, set_width, type_into, wait_for,
};

const WAIT: Duration = Duration::from_secs(60);

pub(crate) async fn sign_in(page: &chromiumoxide::Page, serve: &Serve, key: &str) {
    goto(page, &serve.url("/login")).await;
    type_into(page, "#key", key).await;
    click(page, "form button[type=submit]").await;
    wait_for(
        page,
        "location.pathname === '/runs'",
        WAIT,
        "the runs page after sign-in",
    )
    .await;
}

pub(crate) fn llm_config(llm: &FakeLlm) -> String {
    format!(
        "[llm]\nbase_url = {:?}\nmodel = \"fake-model\"\napi_key = \"fake\"\n",
        llm.base_url()
    )
}

async fn start_run(api: &Api, body: Value) -> Value {
    let (s, run) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 201, "{run}");
    run
}

const HOSTILE_ANSWER: &str = "Done. <img src=x onerror=\"window.__pwned=1\"> <script>window.__pwned=2</script> [click me](javascript:window.__pwned=3) <svg onload=\"window.__pwned=4\"><script>window.__pwned=5</script></svg> **bold**";

const PAGE: &str = "<!doctype html><title>Shot</title><body style=\"background:#0a0\"><h1>screenshot me</h1></body>";

#[tokio::test]
async fn a_run_shows_colours_plot_and_screenshot_survives_a_reload_and_runs_no_injected_script() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "printf '\\033[31mred alert\\033[0m plain \\033]0;title\\007\\033]8;;javascript:window.__pwned=6\\033\\\\osc-link\\033]8;;\\033\\\\ <img src=x onerror=window.__pwned=7>\\n'"}),
        )
        .with_content("Let me *look* first."),
        Reply::tool(
            "python",
            json!({"code": "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"}),
        ),
        Reply::tool("browser_use", json!({"action": "go_to_url", "url": "file:///workspace/page.html"})),
        Reply::tool("browser_use", json!({"action": "screenshot"})),
        // A pause mid-run, for the reload.
        Reply::tool("bash", json!({"command": "echo waited"})).delayed(Duration::from_secs(4)),
        Reply::text(HOSTILE_ANSWER),
    ])
    .await;
    let env = Env::new(&llm_config(&llm)).await;
    let bob_key = env.add_user("bob", &[]);
    let carol_key = env.add_user("carol", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let sid = bob.session().await;
    let r = bob
        .req(
            Method::PUT,
            &format!("/v1/sessions/{sid}/files/content?path=page.html"),
        )
        .body(PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &bob_key).await;
    let run = start_run(
        &bob,
        json!({"task": "show me <b>things</b>", "session_id": sid}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    goto(&page, &serve.url(&format!("/runs/{id}"))).await;

    // Coloured text in the bash card, the plot and the screenshot in theirs.
    wait_for(&page, "[...document.querySelectorAll('.card pre.term span.a-f1')].some(s => s.textContent === 'red alert')", WAIT, "red bash output").await;
    wait_for(&page, "['python', 'browser_use'].every(t => [...document.querySelectorAll('.card')].some(c => c.querySelector('.tool').textContent === t && [...c.querySelectorAll('figure.shot img')].some(i => i.complete && i.naturalWidth > 0)))", WAIT, "the plot and the screenshot").await;
    let cards = eval(&page, "[...document.querySelectorAll('.card')].map(c => [c.querySelector('.tool').textContent, !!c.querySelector('figure.shot img')])").await;
    let cards = cards.as_array().unwrap();
    assert!(
        cards.iter().any(|c| c == &json!(["python", true])),
        "the plot in the python card: {cards:?}"
    );
    assert!(
        cards.iter().any(|c| c == &json!(["browser_use", true])),
        "the screenshot in a browser card: {cards:?}"
    );
    let term = eval(
        &page,
        "document.querySelector('.card pre.term').textContent",
    )
    .await;
    let term = term.as_str().unwrap();
    assert!(
        term.contains("osc-link") && !term.contains("title") && !term.contains("javascript"),
        "escapes dropped: {term:?}"
    );
    assert!(
        term.contains("<img src=x"),
        "the HTML in the output is text: {term:?}"
    );

    // Reload in the middle (the model's fifth answer takes 4 s).
    assert_ne!(
        eval(&page, "document.body.dataset.state").await,
        json!("succeeded"),
        "still running"
    );
    page.reload().await.unwrap();
    wait_for(
        &page,
        "document.body.dataset.state === 'succeeded' && !!document.querySelector('.ev-final')",
        WAIT,
        "the run finished",
    )
    .await;
    // Every event once: the timeline's items have distinct seqs, and the cards match the calls.
    let seqs = eval(
        &page,
        "[...document.querySelectorAll('[data-seq]')].map(e => Number(e.dataset.seq))",
    )
    .await;
    let seqs: Vec<u64> = seqs
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut unique = seqs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        seqs.len(),
        "a duplicated event after the reload: {seqs:?}"
    );
    assert_eq!(
        eval(&page, "document.querySelectorAll('.card').length").await,
        json!(5),
        "five tool calls, five cards"
    );
    assert_eq!(
        eval(&page, "document.querySelectorAll('.ev-final').length").await,
        json!(1)
    );
    let (_, events) = bob.json(Method::GET, &format!("/v1/runs/{id}"), None).await;
    let last_seq = events["last_seq"].as_u64().unwrap();
    // The state can come from the run's row before the stream delivered its last event.
    wait_for(
        &page,
        &format!("Number(document.body.dataset.rendered) === {last_seq}"),
        WAIT,
        "every event rendered",
    )
    .await;

    // The hostile answer is shown as text and nothing it carried ran.
    let fin = eval(&page, "document.querySelector('.ev-final .md').textContent").await;
    assert!(fin.as_str().unwrap().contains("<img src=x"), "{fin}");
    assert_eq!(
        eval(
            &page,
            "document.querySelectorAll('.ev-final .md strong').length"
        )
        .await,
        json!(1),
        "Markdown still renders"
    );
    let hrefs = eval(
        &page,
        "[...document.querySelectorAll('#timeline a')].map(a => a.getAttribute('href'))",
    )
    .await;
    assert!(
        !hrefs.to_string().to_lowercase().contains("javascript"),
        "{hrefs}"
    );
    for i in 0..4 {
        // Give any injected handler a chance, then check the global it would set.
        let _ = eval(&page, "document.querySelectorAll('#timeline a').forEach(a => { if (a.getAttribute('href') !== '#unsafe-link-removed') return; a.click(); })").await;
        tokio::time::sleep(Duration::from_millis(50 * i)).await;
    }
    assert_eq!(
        eval(&page, "window.__pwned === undefined").await,
        json!(true),
        "an injected script ran"
    );
    let usage = eval(&page, "document.querySelector('#usage').textContent").await;
    assert!(usage.as_str().unwrap().ends_with("tokens"), "{usage}");
    for width in [390, 1280] {
        set_width(&page, width, 900).await;
        screenshot(&page, &format!("run-{width}")).await;
    }
    set_width(&page, 1280, 900).await;

    // The runs list shows it.
    goto(&page, &serve.url("/runs")).await;
    wait_for(
        &page,
        &format!("!!document.querySelector('#runs a[href=\"/runs/{id}\"]')"),
        WAIT,
        "the run in the list",
    )
    .await;
    screenshot(&page, "runs-1280").await;

    // Carol: bob's run URL is not found, and its images are not hers.
    browser.browser.clear_cookies().await.unwrap();
    sign_in(&page, &serve, &carol_key).await;
    goto(&page, &serve.url(&format!("/runs/{id}"))).await;
    wait_for(&page, "document.querySelector('main h1') && document.querySelector('main h1').textContent === 'Not found'", WAIT, "not found for carol").await;
    let r = reqwest::Client::new()
        .get(serve.url(&format!("/runs/{id}")))
        .header("cookie", cookie_header(&page).await)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the page of another user's run is a 404");
    let body = r.text().await.unwrap();
    assert!(
        body.contains("Not found") && !body.contains("show me"),
        "nothing of the run leaks"
    );
    let carol = Api::new(&serve, &carol_key);
    let (s, _) = carol
        .json(
            Method::GET,
            &format!("/v1/runs/{id}/events?follow=false"),
            None,
        )
        .await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn stop_during_a_long_tool_call_shows_cancelled_within_two_seconds() {
    let llm = FakeLlm::start(vec![Reply::tool("bash", json!({"command": "sleep 120"}))]).await;
    let env = Env::new(&llm_config(&llm)).await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &key);
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &key).await;
    let run = start_run(&bob, json!({"task": "sleep for a long time"})).await;
    let id = run["id"].as_str().unwrap();
    goto(&page, &serve.url(&format!("/runs/{id}"))).await;
    wait_for(
        &page,
        "[...document.querySelectorAll('.card .status')].some(s => s.textContent === 'running')",
        WAIT,
        "the long call running",
    )
    .await;
    let start = Instant::now();
    click(&page, "#stop").await;
    wait_for(
        &page,
        "document.querySelector('#state').textContent === 'cancelled'",
        Duration::from_secs(2),
        "cancelled within 2 s of Stop",
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        eval(&page, "document.querySelector('#stop').hidden").await == json!(true),
        "no Stop on a finished run"
    );
    let (_, r) = bob.json(Method::GET, &format!("/v1/runs/{id}"), None).await;
    assert_eq!(r["state"], "cancelled", "{r}");
}

#[tokio::test]
async fn ask_human_is_answered_in_the_page_and_a_follow_up_continues_the_session() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "ask_human",
            json!({"inquire": "Which colour <b>do</b> you like?"}),
        ),
        Reply::text("You like it, noted."),
        Reply::text("Follow-up done."),
    ])
    .await;
    let env = Env::new(&llm_config(&llm)).await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &key);
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &key).await;
    // Started from the page's form.
    type_into(&page, "#task", "ask me something").await;
    click(&page, "#new-run button[type=submit]").await;
    wait_for(
        &page,
        "location.pathname.startsWith('/runs/run')",
        WAIT,
        "the new run's page",
    )
    .await;
    wait_for(
        &page,
        "!document.querySelector('#answer-box').hidden",
        WAIT,
        "the question box",
    )
    .await;
    let q = eval(&page, "document.querySelector('#question').textContent").await;
    assert!(
        q.as_str()
            .unwrap()
            .contains("Which colour <b>do</b> you like?"),
        "{q}"
    );
    type_into(&page, "#answer", "deep blue").await;
    click(&page, "#answer-box button").await;
    wait_for(
        &page,
        "document.body.dataset.state === 'succeeded'",
        WAIT,
        "the run finished after the answer",
    )
    .await;
    let tool_msg = llm
        .requests()
        .iter()
        .filter_map(|b| last_of_role(b, "tool"))
        .find(|t| t.contains("deep blue"));
    assert!(
        tool_msg.is_some(),
        "the answer reached the model: {:?}",
        llm.requests()
            .iter()
            .map(|b| last_of_role(b, "tool"))
            .collect::<Vec<_>>()
    );
    let first = eval(&page, "location.pathname.split('/').pop()").await;
    let (_, first_run) = bob
        .json(
            Method::GET,
            &format!("/v1/runs/{}", first.as_str().unwrap()),
            None,
        )
        .await;

    // The follow-up box continues the same session.
    type_into(&page, "#follow", "and now?").await;
    click(&page, "#follow-up button").await;
    wait_for(
        &page,
        &format!("location.pathname !== '/runs/{}'", first.as_str().unwrap()),
        WAIT,
        "the follow-up's page",
    )
    .await;
    wait_for(
        &page,
        "document.body.dataset.state === 'succeeded'",
        WAIT,
        "the follow-up finished",
    )
    .await;
    let second = eval(&page, "location.pathname.split('/').pop()").await;
    let (_, second_run) = bob
        .json(
            Method::GET,
            &format!("/v1/runs/{}", second.as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(first_run["session_id"], second_run["session_id"]);
}

async fn cookie_header(page: &chromiumoxide::Page) -> String {
    let cookies = page.get_cookies().await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name == "sandboxd_session")
        .unwrap();
    format!("sandboxd_session={}", c.value)
}
