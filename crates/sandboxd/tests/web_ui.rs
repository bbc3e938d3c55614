//! The web UI in a real browser (Debian's chromium, driven over CDP) against a real
//! `sandboxd serve` process, the real engine and image: sign-in, cookie and CSRF rules,
//! security headers, the admin page, the files view with hostile names and HTML, downloads.
//! Screenshots land in target/ui-artifacts/.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve};
use support::web_browser::{
    WebBrowser, click, eval, goto, screenshot, set_width, type_into, wait_for,
};

const WAIT: Duration = Duration::from_secs(20);

/// Signs in through the login form and waits for the runs page.
pub async fn sign_in(page: &chromiumoxide::Page, serve: &Serve, key: &str) {
    goto(page, &serve.url("/login")).await;
    type_into(page, "#key", key).await;
    click(page, "form button[type=submit]").await;
    wait_for(
        page,
        "location.pathname === '/runs' && document.body.dataset.page === 'runs'",
        WAIT,
        "the runs page after sign-in",
    )
    .await;
}

/// A fetch made in the page; returns [status, text].
async fn page_fetch(
    page: &chromiumoxide::Page,
    method: &str,
    path: &str,
    with_csrf: bool,
    body: Option<&str>,
) -> (u16, String) {
    let headers = if with_csrf {
        "{'Content-Type': 'application/json', 'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content}"
    } else {
        "{'Content-Type': 'application/json'}"
    };
    let body = body
        .map(|b| format!(", body: {}", serde_json::to_string(b).unwrap()))
        .unwrap_or_default();
    let v = eval(
        page,
        &format!("(async () => {{ const r = await fetch({path:?}, {{method: {method:?}, headers: {headers}{body}}}); return [r.status, await r.text()]; }})()"),
    )
    .await;
    (
        v[0].as_u64().unwrap() as u16,
        v[1].as_str().unwrap_or("").to_string(),
    )
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test]
async fn sign_in_sets_a_strict_cookie_csrf_guards_writes_and_sign_out_ends_it() {
    let env = Env::new("").await;
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let http = no_redirects();

    // Headers of a page: the strict CSP and friends.
    let r = http.get(serve.url("/login")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    for part in [
        "script-src 'self'",
        "frame-ancestors 'none'",
        "default-src 'none'",
        "style-src 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "same-origin");
    // Signed out, pages send you to the form.
    let r = http.get(serve.url("/runs")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/login");

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    // A wrong key: the form again, with the reason.
    goto(&page, &serve.url("/login")).await;
    type_into(&page, "#key", "sbx_not_a_key").await;
    click(&page, "form button[type=submit]").await;
    wait_for(
        &page,
        "document.querySelector('.error') !== null",
        WAIT,
        "the error of a wrong key",
    )
    .await;

    sign_in(&page, &serve, &bob_key).await;
    assert_eq!(
        eval(&page, "document.cookie").await,
        json!(""),
        "the cookie is HttpOnly"
    );
    let cookies = page.get_cookies().await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name == "sandboxd_session")
        .expect("the session cookie");
    assert!(c.http_only, "{c:?}");
    assert_eq!(format!("{:?}", c.same_site), "Some(Strict)");
    assert!(c.expires > 0.0 && !c.session, "the cookie expires: {c:?}");
    assert!(c.value.len() >= 40, "a long random token");

    // The cookie authenticates the API; a write needs the CSRF token.
    let (s, me) = page_fetch(&page, "GET", "/v1/me", false, None).await;
    assert_eq!(s, 200, "{me}");
    assert_eq!(serde_json::from_str::<Value>(&me).unwrap()["name"], "bob");
    let (s, body) = page_fetch(&page, "POST", "/v1/sessions", false, Some("{}")).await;
    assert_eq!(s, 403, "a write with the cookie and no CSRF token: {body}");
    assert!(body.contains("csrf_failed"), "{body}");
    let (s, body) = page_fetch(&page, "POST", "/v1/sessions", true, Some("{}")).await;
    assert_eq!(s, 201, "{body}");
    let sid = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Outside the browser: the same cookie, a wrong token or another origin, is refused.
    let cookie = format!("sandboxd_session={}", c.value);
    let csrf = eval(
        &page,
        "document.querySelector('meta[name=csrf-token]').content",
    )
    .await;
    let csrf = csrf.as_str().unwrap();
    let del = |token: &str, origin: &str| {
        http.delete(serve.url(&format!("/v1/sessions/{sid}")))
            .header("cookie", &cookie)
            .header("x-csrf-token", token)
            .header("origin", origin)
            .send()
    };
    assert_eq!(del("wrong", &serve.base).await.unwrap().status(), 403);
    assert_eq!(
        del(csrf, "http://evil.example").await.unwrap().status(),
        403
    );
    let r = http
        .post(serve.url("/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        403,
        "sign-out needs the token too (no forced sign-out)"
    );
    let (s, _) = page_fetch(&page, "GET", &format!("/v1/sessions/{sid}"), false, None).await;
    assert_eq!(s, 200, "nothing was deleted");

    // Sign out: the cookie no longer works, even if replayed.
    click(&page, ".signout button").await;
    wait_for(
        &page,
        "location.pathname === '/login'",
        WAIT,
        "the sign-in page after sign-out",
    )
    .await;
    let r = http
        .get(serve.url("/v1/me"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a signed-out cookie is dead");
    let (s, _) = page_fetch(&page, "GET", "/v1/me", false, None).await;
    assert_eq!(s, 401);
    let bob = Api::new(&serve, &bob_key);
    bob.json(Method::DELETE, &format!("/v1/sessions/{sid}"), None)
        .await;
}

#[tokio::test]
async fn the_admin_page_adds_rotates_and_removes_users_and_ends_sessions() {
    let env = Env::new("").await;
    let root_key = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let bobs = bob.session().await;

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &root_key).await;
    goto(&page, &serve.url("/admin")).await;
    wait_for(
        &page,
        "document.querySelector('#users tr[data-user=bob]') !== null",
        WAIT,
        "bob in the users table",
    )
    .await;
    wait_for(
        &page,
        &format!("document.querySelector('#sessions tr[data-session={bobs:?}]') !== null"),
        WAIT,
        "bob's session",
    )
    .await;
    let row = eval(
        &page,
        &format!("document.querySelector('#sessions tr[data-session={bobs:?}]').innerText"),
    )
    .await;
    assert!(
        row.as_str().unwrap().contains("bob"),
        "the owner's name: {row}"
    );
    let users = eval(
        &page,
        "document.querySelector('#users tr[data-user=bob]').innerText",
    )
    .await;
    assert!(
        users.as_str().unwrap().contains("1 / "),
        "usage against quota: {users}"
    );

    // Add a user: the key is shown once and works.
    type_into(&page, "#new-name", "dave").await;
    click(&page, "#add-user button").await;
    wait_for(
        &page,
        "document.querySelector('#new-key code.secret') !== null",
        WAIT,
        "the new key",
    )
    .await;
    let key = eval(
        &page,
        "document.querySelector('#new-key code.secret').textContent",
    )
    .await;
    let key = key.as_str().unwrap().to_string();
    let dave = Api::new(&serve, &key);
    let (s, me) = dave.json(Method::GET, "/v1/me", None).await;
    assert_eq!((s, me["name"].as_str()), (200, Some("dave")));
    for width in [390, 1280] {
        set_width(&page, width, 900).await;
        screenshot(&page, &format!("admin-{width}")).await;
    }
    set_width(&page, 1280, 900).await;

    // Rotate: the old key dies, the new one is shown.
    eval(&page, "window.confirm = () => true").await;
    wait_for(
        &page,
        "document.querySelector('#users tr[data-user=dave]') !== null",
        WAIT,
        "dave's row",
    )
    .await;
    click(&page, "#users tr[data-user=dave] button").await;
    wait_for(
        &page,
        &format!("document.querySelector('#new-key code.secret').textContent !== {key:?}"),
        WAIT,
        "the rotated key",
    )
    .await;
    let rotated = eval(
        &page,
        "document.querySelector('#new-key code.secret').textContent",
    )
    .await;
    assert_eq!(
        dave.json(Method::GET, "/v1/me", None).await.0,
        401,
        "the old key stops working"
    );
    let dave2 = Api::new(&serve, rotated.as_str().unwrap());
    assert_eq!(dave2.json(Method::GET, "/v1/me", None).await.0, 200);

    // End bob's session from the page.
    click(
        &page,
        &format!("#sessions tr[data-session={bobs:?}] button"),
    )
    .await;
    wait_for(
        &page,
        &format!("document.querySelector('#sessions tr[data-session={bobs:?}]') === null"),
        WAIT,
        "the ended session gone",
    )
    .await;
    // Ended, not deleted (issue 20 point 6): the session and its history stay.
    let (s, v) = bob
        .json(Method::GET, &format!("/v1/sessions/{bobs}"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("ended")), "{v}");

    // Remove dave.
    click(&page, "#users tr[data-user=dave] button.danger").await;
    wait_for(
        &page,
        "document.querySelector('#users tr[data-user=dave]') === null",
        WAIT,
        "dave removed",
    )
    .await;
    assert_eq!(dave2.json(Method::GET, "/v1/me", None).await.0, 401);

    // The admin API: a non-admin gets 404 everywhere, bad names are explained.
    let root = Api::new(&serve, &root_key);
    for (m, path, body) in [
        (Method::POST, "/v1/users", Some(json!({"name": "eve"}))),
        (Method::DELETE, "/v1/users/root", None),
        (Method::POST, "/v1/users/root/rotate", None),
    ] {
        let (s, v) = bob.json(m.clone(), path, body).await;
        assert_eq!(s, 404, "{m} {path}: {v}");
    }
    let (s, v) = root
        .json(Method::POST, "/v1/users", Some(json!({"name": "<bad>"})))
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = root
        .json(Method::POST, "/v1/users", Some(json!({"name": "bob"})))
        .await;
    assert_eq!(s, 409, "{v}");
    let (s, v) = root.json(Method::DELETE, "/v1/users/nobody", None).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = root
        .json(
            Method::POST,
            "/v1/users",
            Some(json!({"name": "erin", "admin": true})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert!(
        v["key"].as_str().unwrap().starts_with("sbx_") && v["user"]["admin"] == true,
        "{v}"
    );

    // A non-admin's /admin says not found.
    let page2 = browser.browser.new_page("about:blank").await.unwrap();
    drop(page);
    sign_in_fresh(&browser, &serve, &bob_key, &page2).await;
    goto(&page2, &serve.url("/admin")).await;
    let text = eval(&page2, "document.querySelector('main').innerText").await;
    assert!(text.as_str().unwrap().contains("Not found"), "{text}");
}

/// Signs out whoever is signed in in this browser, then signs in with `key`.
async fn sign_in_fresh(browser: &WebBrowser, serve: &Serve, key: &str, page: &chromiumoxide::Page) {
    browser.browser.clear_cookies().await.unwrap();
    sign_in(page, serve, key).await;
}

const HOSTILE_NAME: &str = "<img src=x onerror=window.__pwned=1>.txt";
const SVG: &str = r#"<svg xmlns="http://www.w3.org/2000/svg" onload="window.top.__pwned=3"><script>window.top.__pwned=4</script></svg>"#;
const HTML: &str = r#"<!doctype html><h1 id="h">Report</h1><script>window.top.__pwned=5; document.getElementById('h').textContent='scripted';</script><a id="l" href="javascript:window.top.__pwned=6">x</a><form action="/logout" method="post"><button>go</button></form>"#;

#[tokio::test]
async fn the_files_view_shows_hostile_files_as_data_and_downloads_the_sandboxs_bytes() {
    let env = Env::new("").await;
    let bob_key = env.add_user("bob", &[]);
    let carol_key = env.add_user("carol", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let carol = Api::new(&serve, &carol_key);
    let sid = bob.session().await;
    let carols = carol.session().await;
    let put = |path: String, bytes: Vec<u8>| {
        bob.req(
            Method::PUT,
            &format!("/v1/sessions/{sid}/files/content?path={}", urlencode(&path)),
        )
        .body(bytes)
        .send()
    };
    let png = tiny_png();
    let binary: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    for (path, bytes) in [
        (
            HOSTILE_NAME.to_string(),
            b"first <script>window.__pwned=2</script> \x1b]0;title\x07 text".to_vec(),
        ),
        ("evil.svg".to_string(), SVG.as_bytes().to_vec()),
        ("report.html".to_string(), HTML.as_bytes().to_vec()),
        ("out/plot.png".to_string(), png.clone()),
        ("data.bin".to_string(), binary.clone()),
    ] {
        assert_eq!(
            put(path.clone(), bytes).await.unwrap().status(),
            200,
            "{path}"
        );
    }

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    sign_in(&page, &serve, &bob_key).await;
    goto(&page, &serve.url(&format!("/sessions/{sid}/files"))).await;
    wait_for(
        &page,
        "document.querySelectorAll('#tree .entry').length >= 5",
        WAIT,
        "the tree",
    )
    .await;
    let names = eval(
        &page,
        "[...document.querySelectorAll('#tree .entry')].map(b => b.textContent)",
    )
    .await;
    assert!(
        names.as_array().unwrap().contains(&json!(HOSTILE_NAME)),
        "the name shown as text: {names}"
    );

    // The hostile text file: shown as text.
    click(
        &page,
        &format!(
            "#tree .entry[data-path={:?}]",
            format!("/workspace/{HOSTILE_NAME}")
        ),
    )
    .await;
    wait_for(
        &page,
        "document.querySelector('#viewer pre.file-text') !== null",
        WAIT,
        "the text",
    )
    .await;
    let text = eval(
        &page,
        "document.querySelector('#viewer pre.file-text').textContent",
    )
    .await;
    assert!(
        text.as_str()
            .unwrap()
            .contains("<script>window.__pwned=2</script>"),
        "{text}"
    );
    // The SVG: its source, as text.
    click(&page, "#tree .entry[data-path='/workspace/evil.svg']").await;
    wait_for(
        &page,
        "(document.querySelector('#viewer pre.file-text') || {}).textContent?.includes('<svg')",
        WAIT,
        "the svg as text",
    )
    .await;
    // The HTML deliverable: previewed in a sandboxed frame with an opaque origin.
    click(&page, "#tree .entry[data-path='/workspace/report.html']").await;
    wait_for(
        &page,
        "document.querySelector('#viewer iframe.preview') !== null",
        WAIT,
        "the preview frame",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let frame = eval(&page, "(() => { const f = document.querySelector('#viewer iframe.preview'); let doc = 'opaque'; try { doc = f.contentDocument ? 'readable' : 'opaque'; } catch (e) {} return [f.getAttribute('sandbox'), doc]; })()").await;
    assert_eq!(frame, json!(["", "opaque"]), "no same-origin, no script");
    let r = no_redirects()
        .get(serve.url(&format!("/ui/preview/{sid}?path=report.html")))
        .header("cookie", cookie_header(&page).await)
        .send()
        .await
        .unwrap();
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.starts_with("sandbox;")
            && !csp.contains("allow-same-origin")
            && !csp.contains("allow-scripts"),
        "{csp}"
    );
    // The image, in the page.
    click(&page, "#tree .entry[data-path='/workspace/out']").await;
    wait_for(
        &page,
        "document.querySelector(\"#tree .entry[data-path='/workspace/out/plot.png']\") !== null",
        WAIT,
        "the subdirectory",
    )
    .await;
    click(&page, "#tree .entry[data-path='/workspace/out/plot.png']").await;
    wait_for(
        &page,
        "(document.querySelector('#viewer img.file-image') || {}).naturalWidth === 2",
        WAIT,
        "the image decoded",
    )
    .await;
    for width in [390, 1280] {
        set_width(&page, width, 900).await;
        screenshot(&page, &format!("files-{width}")).await;
    }
    assert_eq!(
        eval(&page, "window.__pwned === undefined").await,
        json!(true),
        "nothing injected ran"
    );

    // Downloads give the bytes written in the sandbox: one file, and the whole workspace.
    let got = page_bytes(
        &page,
        &format!("/v1/sessions/{sid}/files/content?path=data.bin"),
    )
    .await;
    assert_eq!(got, binary);
    let href = eval(
        &page,
        "document.querySelector('#archive').getAttribute('href')",
    )
    .await;
    let tar_bytes = page_bytes(&page, href.as_str().unwrap()).await;
    let mut found = std::collections::BTreeMap::new();
    for entry in tar::Archive::new(&tar_bytes[..]).entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut buf).unwrap();
        found.insert(name, buf);
    }
    assert_eq!(found.get("data.bin"), Some(&binary), "{:?}", found.keys());
    assert_eq!(found.get("out/plot.png"), Some(&png));
    assert_eq!(
        found.get("evil.svg").map(|v| v.as_slice()),
        Some(SVG.as_bytes())
    );

    // Another user's files page: not found.
    goto(&page, &serve.url(&format!("/sessions/{carols}/files"))).await;
    let text = eval(&page, "document.querySelector('main').innerText").await;
    assert!(text.as_str().unwrap().contains("Not found"), "{text}");
    let (s, _) = page_fetch(
        &page,
        "GET",
        &format!("/v1/sessions/{carols}/files"),
        false,
        None,
    )
    .await;
    assert_eq!(s, 404);
}

async fn cookie_header(page: &chromiumoxide::Page) -> String {
    let cookies = page.get_cookies().await.unwrap();
    let c = cookies
        .iter()
        .find(|c| c.name == "sandboxd_session")
        .unwrap();
    format!("sandboxd_session={}", c.value)
}

/// Bytes fetched by the page (with its cookie), through base64.
async fn page_bytes(page: &chromiumoxide::Page, path: &str) -> Vec<u8> {
    let v = eval(
        page,
        &format!("(async () => {{ const r = await fetch({path:?}); const b = new Uint8Array(await r.arrayBuffer()); let s = ''; for (const x of b) s += String.fromCharCode(x); return [r.status, btoa(s)]; }})()"),
    )
    .await;
    assert_eq!(v[0], 200, "{path}");
    base64::engine::general_purpose::STANDARD
        .decode(v[1].as_str().unwrap())
        .unwrap()
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A valid 2x1 PNG.
fn tiny_png() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode("iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAADUlEQVR4nGP4zwAE/wEHAAH/4iOeWQAAAABJRU5ErkJggg==")
        .unwrap()
}
