//! The web sign-in's lifetime (`[server] sign_in_secs`) against a real `sandboxd serve`
//! process, at the HTTP level (reqwest carrying the cookie, as a browser would): the cookie
//! is made to last exactly the configured time, works while it lasts, and once it has run
//! out the pages send the user to sign in again and a write with the cookie (CSRF token
//! and all) is refused, while the user's API key still works and a new sign-in does too.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve, code};

/// Short enough to wait for, long enough for a few local requests to fit inside it.
const LIFETIME_SECS: u64 = 4;

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// One sign-in: the `Cookie` header it gives, its CSRF token and when it was made.
struct SignIn {
    cookie: String,
    csrf: String,
    made: Instant,
}

/// Signs in through the form, checks the cookie's Max-Age, and reads the CSRF token from
/// the runs page the way the page's scripts do (its `<meta name=csrf-token>`).
async fn sign_in(http: &reqwest::Client, serve: &Serve, key: &str) -> SignIn {
    let made = Instant::now();
    let r = http
        .post(serve.url("/login"))
        .form(&[("key", key)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "sign-in: {:?}", r.text().await);
    assert_eq!(r.headers()["location"], "/runs");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let max_age = set
        .split(';')
        .find_map(|p| p.trim().strip_prefix("Max-Age="))
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(
        max_age,
        Some(LIFETIME_SECS),
        "the cookie lasts [server] sign_in_secs: {set}"
    );
    let cookie = set.split(';').next().unwrap().trim().to_string();
    assert!(cookie.starts_with("sandboxd_session="), "{set}");
    let page = http
        .get(serve.url("/runs"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    let csrf = html
        .split("<meta name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the runs page: {html}"))
        .to_string();
    SignIn { cookie, csrf, made }
}

/// A state-changing API call made with the cookie and its CSRF token: creating a session.
async fn cookie_write(
    http: &reqwest::Client,
    serve: &Serve,
    s: &SignIn,
    body: Value,
) -> (u16, Value) {
    let r = http
        .post(serve.url("/v1/sessions"))
        .header("cookie", &s.cookie)
        .header("x-csrf-token", &s.csrf)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn cookie_get(
    http: &reqwest::Client,
    serve: &Serve,
    s: &SignIn,
    path: &str,
) -> reqwest::Response {
    http.get(serve.url(path))
        .header("cookie", &s.cookie)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_sign_in_ends_after_its_lifetime_and_the_api_key_still_works() {
    let env = Env::new(&format!(
        "[server]\ndrain_secs = 2\nbody_limit_kb = 64\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\nsign_in_secs = {LIFETIME_SECS}\n"
    ))
    .await;
    let key = env.add_user("bob", &[]);
    let serve = env.start();
    let http = no_redirects();
    let lifetime = Duration::from_secs(LIFETIME_SECS);

    // While it lasts, the cookie reads and (with its token) writes: a body the handler
    // refuses proves the request got past the sign-in and CSRF checks without creating a
    // session. On a machine so slow that the checks outlast the lifetime, they prove
    // nothing, so the sign-in is made again.
    let mut live = None;
    for _ in 0..3 {
        let s = sign_in(&http, &serve, &key).await;
        let me = cookie_get(&http, &serve, &s, "/v1/me").await;
        let me_status = me.status().as_u16();
        let me: Value = me.json().await.unwrap_or(Value::Null);
        let write = cookie_write(&http, &serve, &s, json!({"limits": "not an object"})).await;
        if s.made.elapsed() < lifetime {
            assert_eq!(me_status, 200, "{me}");
            assert_eq!(me["name"], "bob");
            assert_eq!(write.0, 400, "the write passed the sign-in: {}", write.1);
            assert_eq!(code(&write.1), "invalid_request", "{}", write.1);
            live = Some(s);
            break;
        }
    }
    let s = live.expect("three sign-ins each ran out before a few local requests finished");

    // Bounded wait for the end: with the default 12 hours this would never come.
    let deadline = s.made + lifetime + Duration::from_secs(60);
    loop {
        let r = cookie_get(&http, &serve, &s, "/v1/me").await;
        if r.status() == 401 {
            break;
        }
        assert_eq!(r.status(), 200);
        assert!(
            Instant::now() < deadline,
            "the sign-in outlived [server] sign_in_secs = {LIFETIME_SECS}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Ended: every page sends the user to the sign-in form.
    for path in ["/runs", "/admin", "/"] {
        let r = cookie_get(&http, &serve, &s, path).await;
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(r.headers()["location"], "/login", "{path}");
    }
    // A write with the cookie and its (once valid) CSRF token is refused, and made nothing.
    let (status, body) = cookie_write(&http, &serve, &s, json!({})).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(code(&body), "unauthorized", "{body}");
    let bob = Api::new(&serve, &key);
    let (status, list) = bob.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list["sessions"],
        json!([]),
        "the refused write made no session"
    );

    // The API key is not a sign-in: it still reads and writes.
    let (status, me) = bob.json(Method::GET, "/v1/me", None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["name"], "bob");
    let id = bob.session().await;
    let (status, body) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert!((200..300).contains(&status), "{status} {body}");

    // And signing in again gives a working sign-in.
    let again = sign_in(&http, &serve, &key).await;
    assert_ne!(again.cookie, s.cookie);
    let r = cookie_get(&http, &serve, &again, "/v1/me").await;
    assert_eq!(r.status(), 200);
}
