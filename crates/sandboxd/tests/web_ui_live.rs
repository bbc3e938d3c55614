//! The run view's live text in a real browser (Debian's chromium) against a real `sandboxd
//! serve`, the real engine and image, the LLM faked at the HTTP boundary and streaming its
//! answers in pieces held by gates: the partial text shows before the step's events, the
//! step's message replaces it (one of the two always on the page, never both), a dropped
//! event stream and a reload mid-answer show the answer from its start, not a tail and not
//! twice, and a retried answer drops the failed attempt's text. Also the new-run form's agent
//! select: it lists the profiles (a user-defined one too) and `coding` reaches the model.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::agent_profiles::{assert_shows, profile_config};
use crate::serve;
use crate::support;
use crate::web_ui_runs::{llm_config, sign_in};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Gate, Piece, Reply};
use support::web_browser::{WebBrowser, click, eval, goto, type_into, wait_for};

const WAIT: Duration = Duration::from_secs(60);

/// A TCP relay in front of serve whose connections the test can cut: the browser sees its
/// event stream drop as on a flaky network, and reconnects through the relay.
struct Relay {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Relay {
    async fn start(upstream: &str) -> Relay {
        let upstream: SocketAddr = upstream.trim_start_matches("http://").parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(Mutex::new(Vec::<AbortHandle>::new()));
        let kept = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let relay = tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                kept.lock().unwrap().push(relay.abort_handle());
            }
        });
        Relay {
            addr,
            conns,
            accept: accept.abort_handle(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Closes every connection open now (both sockets are dropped).
    fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The texts of the live boxes on the page.
async fn live_boxes(page: &chromiumoxide::Page) -> Value {
    eval(
        page,
        "[...document.querySelectorAll('#timeline .live-text')].map(b => b.textContent)",
    )
    .await
}

async fn wait_live(page: &chromiumoxide::Page, text: &str, what: &str) {
    let js = format!(
        "(b => b.length === 1 && b[0].textContent === {text:?})([...document.querySelectorAll('#timeline .live-text')])"
    );
    wait_for(page, &js, WAIT, what).await;
}

/// From now on, notes every change of the timeline after which `text` is nowhere in it.
async fn watch_for_gaps(page: &chromiumoxide::Page, text: &str) {
    let js = format!(
        "window.__gaps = 0; new MutationObserver(() => {{ if (!document.querySelector('#timeline').textContent.includes({text:?})) window.__gaps += 1; }}).observe(document.querySelector('#timeline'), {{childList: true, subtree: true, characterData: true}}); true"
    );
    eval(page, &js).await;
}

/// How often `text` is on the page's timeline.
async fn count_on_timeline(page: &chromiumoxide::Page, text: &str) -> u64 {
    let js = format!("document.querySelector('#timeline').textContent.split({text:?}).length - 1");
    eval(page, &js).await.as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn live_text_shows_early_survives_a_dropped_stream_a_reload_and_a_retry() {
    let gates: Vec<Gate> = (0..4).map(|_| Gate::default()).collect();
    let llm = FakeLlm::start(vec![
        Reply::Streamed(vec![
            Piece::text("Looking "),
            Piece::text("around "),
            Piece::Wait(gates[0].clone()),
            Piece::text("the "),
            Piece::Wait(gates[1].clone()),
            Piece::text("workspace."),
            Piece::call(0, "bash", "{\"command\": \"echo one\"}"),
        ]),
        // The second answer breaks half-written; the client retries and the next one answers.
        Reply::Streamed(vec![
            Piece::text("Draft that fails "),
            Piece::Wait(gates[2].clone()),
            Piece::Break,
        ]),
        Reply::Streamed(vec![
            Piece::text("Second "),
            Piece::Wait(gates[3].clone()),
            Piece::text("try."),
            Piece::call(0, "bash", "{\"command\": \"echo two\"}"),
        ]),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "all done"}),
        ),
    ])
    .await;
    let env = Env::new(&llm_config(&llm)).await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let relay = Relay::start(&serve.base).await;
    let bob = Api::new(&serve, &key);
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    goto(&page, &relay.url("/login")).await;
    type_into(&page, "#key", &key).await;
    click(&page, "form button[type=submit]").await;
    wait_for(&page, "location.pathname === '/runs'", WAIT, "signed in").await;
    let (s, run) = bob
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "look around"})),
        )
        .await;
    assert_eq!(s, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    goto(&page, &relay.url(&format!("/runs/{id}"))).await;

    // The first words, while the model holds the rest: the step has drawn nothing yet.
    wait_live(&page, "Looking around ", "the partial text").await;
    assert_eq!(
        eval(&page, "document.querySelectorAll('.ev-text').length").await,
        json!(0)
    );

    // The event stream drops mid-answer: the page reconnects and shows the answer from its
    // start, once (not an empty box, not the text twice).
    eval(&page, "window.__states = []; new MutationObserver(() => window.__states.push(document.querySelector('#live').textContent)).observe(document.querySelector('#live'), {childList: true, subtree: true, characterData: true}); true").await;
    relay.cut();
    wait_for(
        &page,
        "window.__states.includes('reconnecting…') && document.querySelector('#live').textContent === 'live'",
        WAIT,
        "the stream reconnected",
    )
    .await;
    wait_live(
        &page,
        "Looking around ",
        "the text so far after the reconnect",
    )
    .await;
    gates[0].open();
    wait_live(
        &page,
        "Looking around the ",
        "more text after the reconnect",
    )
    .await;

    // A reload mid-answer: the text so far, then the rest, then the step's message alone.
    page.reload().await.unwrap();
    wait_live(
        &page,
        "Looking around the ",
        "the text so far after the reload",
    )
    .await;
    watch_for_gaps(&page, "Looking around the").await;
    gates[1].open();
    wait_for(
        &page,
        "[...document.querySelectorAll('.ev-text .md')].some(m => m.textContent.includes('Looking around the workspace.'))",
        WAIT,
        "the first step's message",
    )
    .await;
    wait_for(
        &page,
        "document.querySelectorAll('#timeline .live-text').length === 0 || document.querySelector('#timeline .live-text').dataset.step !== '1'",
        WAIT,
        "the first step's live text gone",
    )
    .await;
    assert_eq!(
        eval(&page, "window.__gaps").await,
        json!(0),
        "a moment with neither the live text nor the message"
    );
    assert_eq!(
        count_on_timeline(&page, "Looking around the workspace.").await,
        1
    );

    // The second answer breaks half-written: its text goes, the retry's answer replaces it.
    wait_live(&page, "Draft that fails ", "the failing attempt's text").await;
    gates[2].open();
    wait_live(&page, "Second ", "the retried answer's text").await;
    assert_eq!(count_on_timeline(&page, "Draft that fails").await, 0);
    wait_for(
        &page,
        "document.querySelector('#timeline').textContent.includes('attempt 2 of')",
        WAIT,
        "the retry shown",
    )
    .await;
    watch_for_gaps(&page, "Second ").await;
    gates[3].open();
    wait_for(
        &page,
        "document.body.dataset.state === 'succeeded' && !!document.querySelector('.ev-final')",
        WAIT,
        "the run finished",
    )
    .await;
    assert_eq!(live_boxes(&page).await, json!([]), "no live text left");
    assert_eq!(eval(&page, "window.__gaps").await, json!(0));
    assert_eq!(count_on_timeline(&page, "Second try.").await, 1);
    assert_eq!(count_on_timeline(&page, "Draft that fails").await, 0);
    assert_eq!(
        count_on_timeline(&page, "Looking around the workspace.").await,
        1
    );
    // The page's items: each event once, in order (the live boxes never displaced one).
    let seqs = eval(
        &page,
        "[...document.querySelectorAll('#timeline > [data-seq]')].map(e => Number(e.dataset.seq))",
    )
    .await;
    let seqs: Vec<u64> = serde_json::from_value(seqs).unwrap();
    let mut sorted = seqs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seqs, sorted, "the timeline in seq order, no duplicates");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_new_run_form_lists_the_profiles_and_coding_reaches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![Reply::tool(
        "terminate",
        json!({"status": "success", "answer": "coded"}),
    )])
    .await;
    let env = Env::new(&format!(
        "{}{}",
        llm_config(&llm),
        profile_config(dir.path())
    ))
    .await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &key);
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &key).await;

    // Every profile of /v1/agents, the config's own too, with its description.
    wait_for(
        &page,
        "document.querySelectorAll('#agent option').length === 5",
        WAIT,
        "the profiles in the select",
    )
    .await;
    let options = eval(
        &page,
        "[...document.querySelectorAll('#agent option')].map(o => [o.value, o.textContent])",
    )
    .await;
    let values: Vec<&str> = options
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o[0].as_str().unwrap())
        .collect();
    assert_eq!(values, ["general", "coding", "browser", "data", "mine"]);
    assert_eq!(options[4][1], "mine: bash only", "{options}");

    // Choose coding (as a user does: the select's value and its change event) and start.
    type_into(&page, "#task", "fix the build").await;
    eval(&page, "(s => { s.value = 'coding'; s.dispatchEvent(new Event('change', {bubbles: true})); return s.value; })(document.querySelector('#agent'))").await;
    click(&page, "#new-run button[type=submit]").await;
    wait_for(
        &page,
        "location.pathname.startsWith('/runs/run') && document.body.dataset.state === 'succeeded'",
        WAIT,
        "the run finished",
    )
    .await;
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "one request");
    assert_shows(&reqs[0], "coding");
    let id = eval(&page, "location.pathname.split('/').pop()").await;
    let (_, run) = bob
        .json(
            Method::GET,
            &format!("/v1/runs/{}", id.as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(run["agent"], "coding", "{run}");
}
