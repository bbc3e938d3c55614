//! Single sign-on refusing what a real provider's answer can be made into: a relay in front
//! of `oidc-provider-mock` (see web_ui_sso.rs) rewrites the ID token's payload to name another
//! user, its signature kept, and the sign-in is refused ("Signature verification failed"); the
//! mock made to issue tokens that expired two minutes ago gets "Expired". Neither makes a user
//! or a cookie; both are audited with the reason. Without `create_users` an unknown user is
//! refused and a known one signs in. Starts from one address are bounded. (A token for another
//! audience cannot be had from the mock: crates/server/src/sso_tests.rs refuses one signed there.)
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use serde_json::{Value, json};

use crate::web_ui_sso::{
    Provider, cookie_of, no_redirects, page, sign_in, sign_ins, sso_config, start_serve, user,
};
use serve::{Api, Env};

/// What the relay in front of the provider changes in its token answers.
#[derive(Clone, Copy)]
enum Twist {
    /// The ID token's payload names another user (`root`); its signature is kept.
    Tamper,
    /// The provider issues already expired tokens (`--token-max-age -120`), and with them a
    /// negative `expires_in` for the access token, which no client parses: that field is made
    /// positive, so the ID token itself is what gets judged.
    AccessTokenLifetime,
}

/// An HTTP relay in front of the mock on its own loopback port: every request goes through
/// unchanged, Host and all (the mock names itself after the Host it is asked as, so the
/// relay's address is the issuer), except that token answers get `twist`.
async fn relay(upstream: &str, twist: Twist) -> String {
    use axum::extract::{Request, State};
    use axum::response::{IntoResponse, Response};
    async fn forward(State((up, twist)): State<(String, Twist)>, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut r = no_redirects()
            .request(parts.method.clone(), format!("{up}{path}"))
            .body(body.to_vec());
        for (k, v) in &parts.headers {
            r = r.header(k, v);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut body = resp.bytes().await.unwrap().to_vec();
        if parts.uri.path() == "/oauth2/token" && status == 200 {
            body = twisted(&body, twist);
        }
        let mut out = (status, body).into_response();
        for name in ["content-type", "location", "cache-control"] {
            if let Some(v) = headers.get(name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        out
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .fallback(forward)
        .with_state((upstream.to_string(), twist));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

fn twisted(body: &[u8], twist: Twist) -> Vec<u8> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut v: Value = serde_json::from_slice(body).unwrap();
    match twist {
        Twist::Tamper => {
            let token = v["id_token"].as_str().unwrap().to_string();
            let parts: Vec<&str> = token.split('.').collect();
            let mut claims: Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
            claims["preferred_username"] = json!("root");
            let forged = b64.encode(serde_json::to_vec(&claims).unwrap());
            v["id_token"] = json!(format!("{}.{forged}.{}", parts[0], parts[2]));
        }
        Twist::AccessTokenLifetime => {
            assert!(v["expires_in"].as_i64().unwrap() < 0, "{v}");
            v["expires_in"] = json!(60);
        }
    }
    serde_json::to_vec(&v).unwrap()
}

/// A serve whose `[sso]` issuer is a relay (with `twist`) in front of a mock started with
/// `token_max_age`; one failed sign-in through it must be refused for `reason`.
async fn refused(token_max_age: i64, twist: Twist, reason: &str) {
    let provider = Provider::start(token_max_age).await;
    let issuer = relay(&provider.base, twist).await;
    let env = Env::new(&sso_config(&issuer, "")).await;
    let root_key = env.add_user("root", &["--admin"]);
    let serve = start_serve(&env);
    let root = Api::new(&serve, &root_key);
    provider
        .set_user("sub-carol", json!({"preferred_username": "carol"}))
        .await;
    let (s, session, body) = sign_in(&no_redirects(), &serve, "sub-carol").await;
    assert_eq!(s, 401, "{body}");
    assert!(session.is_none());
    assert!(body.contains(reason), "{body}");
    assert!(user(&root, "carol").await.is_null(), "no user is made");
    let got = sign_ins(&root).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "sign_in.failed");
    assert!(
        got[0].2["reason"].as_str().unwrap().contains(reason),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_id_token_is_refused() {
    refused(3600, Twist::Tamper, "Signature verification failed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_id_token_is_refused() {
    refused(-120, Twist::AccessTokenLifetime, "Expired").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_create_users_an_unknown_user_is_refused_and_a_known_one_signs_in() {
    let provider = Provider::start(3600).await;
    let env = Env::new(&sso_config(&provider.base, "create_users = false\n")).await;
    env.add_user("dave", &[]);
    let serve = start_serve(&env);
    provider
        .set_user("sub-dave", json!({"preferred_username": "dave"}))
        .await;
    provider
        .set_user("sub-zed", json!({"preferred_username": "zed"}))
        .await;
    let http = no_redirects();
    let (s, session, body) = sign_in(&http, &serve, "sub-zed").await;
    assert_eq!(s, 403, "{body}");
    assert!(session.is_none());
    assert!(body.contains("create_users is off"), "{body}");
    let (s, session, body) = sign_in(&http, &serve, "sub-dave").await;
    assert_eq!(s, 200, "{body}");
    let (s, html) = page(&http, &serve, "/runs", &session.unwrap()).await;
    assert_eq!(s, 200);
    assert!(html.contains("<span class=\"who\">dave</span>"), "{html}");
}

/// Starts are bounded per address (each keeps a row in the store for ten minutes): past
/// `[server] auth_failures_per_minute` the address gets 429, and a valid key still signs in.
#[tokio::test(flavor = "multi_thread")]
async fn sign_in_starts_from_one_address_are_bounded() {
    let provider = Provider::start(3600).await;
    let config = sso_config(&provider.base, "");
    let env = Env::new(&format!("{config}[server]\nauth_failures_per_minute = 3\n")).await;
    let key = env.add_user("erin", &[]);
    let serve = start_serve(&env);
    let http = no_redirects();
    for i in 0..3 {
        let r = http.get(serve.url("/login/sso")).send().await.unwrap();
        assert_eq!(r.status(), 303, "start {i}");
    }
    let r = http.get(serve.url("/login/sso")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(
        cookie_of(&r, "sandboxd_sso").is_none(),
        "no attempt is kept"
    );
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("Too many sign-in attempts")
    );
    let r = http
        .post(serve.url("/login"))
        .form(&[("key", key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "a valid key is never refused");
}
