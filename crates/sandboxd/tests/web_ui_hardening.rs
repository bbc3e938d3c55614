//! Two small hardenings of the web UI against a real `sandboxd serve`: an HTML preview opened
//! as a page of its own is a download (model-made HTML never shows as a page on the service's
//! origin), while the files page's frame still gets it inline; and a Markdown table's column
//! alignment works under the page's CSP in a real Chromium (classes, not the inline `style`
//! the CSP blocks).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use serve::{Api, Env, Serve};
use support::web_browser::{WebBrowser, click, eval, goto, type_into, wait_for};

const WAIT: Duration = Duration::from_secs(20);

/// Signs in through the form with reqwest; returns the `Cookie` header value.
async fn cookie(serve: &Serve, key: &str) -> String {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .post(serve.url("/login"))
        .form(&[("key", key)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in: {:?}", r.text().await);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    set.split(';').next().unwrap().trim().to_string()
}

#[tokio::test]
async fn a_preview_is_a_download_unless_the_browser_loads_it_into_a_frame() {
    let env = Env::new("").await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &key);
    let sid = bob.session().await;
    let page = "<!doctype html><h1>Sign in to your bank</h1>";
    let r = bob
        .req(
            Method::PUT,
            &format!("/v1/sessions/{sid}/files/content?path=login.html"),
        )
        .body(page)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "upload: {}", r.status());
    let cookie = cookie(&serve, &key).await;
    let get = |dest: Option<&'static str>| {
        let mut req = reqwest::Client::new()
            .get(serve.url(&format!("/ui/preview/{sid}?path=login.html")))
            .header("cookie", &cookie);
        if let Some(d) = dest {
            req = req.header("sec-fetch-dest", d);
        }
        req.send()
    };
    // A top-level navigation (a link someone was sent), and a client that says nothing.
    for dest in [Some("document"), None] {
        let r = get(dest).await.unwrap();
        assert_eq!(r.status(), 200, "{dest:?}");
        let disposition = r
            .headers()
            .get("content-disposition")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(
            disposition.as_deref(),
            Some("attachment; filename=\"login.html\""),
            "{dest:?}: a preview outside a frame must be a download"
        );
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("sandbox;"), "{csp}");
    }
    // The files page's frame (and a legacy frame): inline, still sandboxed.
    for dest in ["iframe", "frame"] {
        let r = get(Some(dest)).await.unwrap();
        assert_eq!(r.status(), 200, "{dest}");
        assert!(
            r.headers().get("content-disposition").is_none(),
            "{dest}: {:?}",
            r.headers()
        );
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(
            csp.starts_with("sandbox;") && !csp.contains("allow-scripts"),
            "{csp}"
        );
        assert_eq!(r.text().await.unwrap(), page);
    }
}

#[tokio::test]
async fn an_aligned_markdown_table_is_aligned_under_the_pages_csp_in_a_real_browser() {
    let env = Env::new("").await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    goto(&page, &serve.url("/login")).await;
    type_into(&page, "#key", &key).await;
    click(&page, "form button[type=submit]").await;
    wait_for(
        &page,
        "location.pathname === '/runs' && document.body.dataset.page === 'runs'",
        WAIT,
        "the runs page after sign-in",
    )
    .await;
    // The model's text rendered by the server, inserted the way the page's script inserts
    // fragments (a template's innerHTML), under the page's own CSP.
    let event = json!({"type": "assistant_text", "seq": 1, "step": 1,
        "text": "| name | amount |\n|:--|--:|\n| a | 12345 |\n| b | 7 |\n"});
    let js = format!(
        r#"(async () => {{
            const violations = [];
            document.addEventListener('securitypolicyviolation', e => violations.push(e.violatedDirective));
            const r = await fetch('/ui/render', {{method: 'POST', headers: {{'Content-Type': 'application/json',
                'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content}},
                body: JSON.stringify({{events: [{event}]}})}});
            const html = (await r.json()).fragments[0].html;
            const t = document.createElement('template');
            t.innerHTML = html;
            const box = document.createElement('div');
            box.append(t.content);
            document.querySelector('main').append(box);
            await new Promise(done => setTimeout(done, 300));
            const cell = box.querySelector('tbody td:last-child');
            const first = box.querySelector('tbody td:first-child');
            return [getComputedStyle(cell).textAlign, getComputedStyle(first).textAlign,
                    box.querySelectorAll('[style]').length, violations];
        }})()"#
    );
    let v = eval(&page, &js).await;
    assert_eq!(
        v,
        json!(["right", "left", 0, []]),
        "[right cell, left cell, elements with style=, CSP violations]"
    );
}
