//! Signing in to the web UI: an API key typed once becomes an HttpOnly, SameSite=Strict
//! session cookie (Secure when the request came over https) that expires after `[server]
//! sign_in_secs` (or with the key, if sooner), so the page's fetch and EventSource calls
//! (which cannot send an Authorization header) are authenticated. The cookie holds a random
//! token; the store keeps its SHA-256, the user and the key it was made with (rotating the
//! key ends the sign-in) and a CSRF token.
//!
//! CSRF: every state-changing request made with the cookie must carry the sign-in's token in
//! `X-CSRF-Token` (fetch) or a `csrf` form field (sign-out), and an `Origin`, when sent, must
//! be this host. GET and HEAD change nothing and need only the cookie.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::pages;
use crate::AppState;
use crate::auth::{Credential, authenticate};
use crate::error::{ApiError, ErrorCode};
use crate::proxies::ClientAddr;
use crate::streams::Revoked;
use sandboxd_core::store::{Login, NewLogin, now_ms};

pub const COOKIE: &str = "sandboxd_session";
pub const CSRF_HEADER: &str = "x-csrf-token";

pub(super) fn random_token() -> String {
    let raw: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

pub(super) fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The value of the request's cookie `name`, if it carries one.
pub(super) fn cookie_named<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The cookie's token, if the request carries one of ours.
fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    cookie_named(headers, COOKIE).filter(|v| !v.is_empty() && v.len() <= 64)
}

/// The sign-in the request's cookie names, if it is live, with its token's hash (the
/// credential its streams are registered under).
pub async fn from_cookie(
    st: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(Login, [u8; 32])>, ApiError> {
    let Some(token) = cookie_token(headers) else {
        return Ok(None);
    };
    let hash = token_hash(token);
    Ok(st.store.login(hash, now_ms()).await?.map(|l| (l, hash)))
}

/// Whether a request with the cookie has a method that changes something.
pub fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Equal-time comparison: the token is a secret.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Refuses a request whose `Origin` (sent by browsers on every POST) is not this host.
pub fn check_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, h)| h).unwrap_or("");
    if !host.is_empty() && origin_host.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::CsrfFailed,
            format!("a request from origin {origin:?} may not use this site's sign-in"),
        ))
    }
}

/// The CSRF check of a cookie-authenticated request that changes state.
pub fn check_csrf(headers: &HeaderMap, login: &Login) -> Result<(), ApiError> {
    check_origin(headers)?;
    let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match sent {
        Some(t) if same(t, &login.csrf) => Ok(()),
        _ => Err(ApiError::new(
            ErrorCode::CsrfFailed,
            "this request uses the web sign-in but lacks its CSRF token; send it in X-CSRF-Token (the page's <meta name=csrf-token>), or use an API key in Authorization",
        )),
    }
}

pub(super) fn is_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

fn set_cookie(value: &str, max_age_secs: i64, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}"
    ))
    .ok()
}

#[derive(Deserialize)]
pub struct LoginForm {
    key: String,
}

/// POST /login: the key from the form becomes a sign-in, or the form again with the reason.
/// The key is checked first: a right key signs in whatever failures its address made.
pub async fn login(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    client: Option<Extension<ClientAddr>>,
    who: crate::audit::Who,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let ip = client.map_or_else(|| peer.ip().to_canonical(), |Extension(c)| c.0);
    if check_origin(&headers).is_err() {
        return pages::login_page_with(
            Some("This sign-in came from another site and was refused."),
            StatusCode::FORBIDDEN,
            st.sso.is_some(),
        );
    }
    let user = match authenticate(&st, form.key.trim()).await {
        Ok(Some(u)) => u,
        Ok(None) => {
            let details = serde_json::json!({"reason": "not a valid key"});
            crate::audit::record(&st, &who, "sign_in.failed", "-", details).await;
            return match st.throttle.failed(ip).await {
                Ok(Some(_)) => pages::login_page_with(
                    Some("Too many failed sign-ins from your address; wait a minute."),
                    StatusCode::TOO_MANY_REQUESTS,
                    st.sso.is_some(),
                ),
                Ok(None) => pages::login_page_with(
                    Some(
                        "That key is not valid. Keys start with sbx_; an admin makes one with `sandboxd users add`.",
                    ),
                    StatusCode::UNAUTHORIZED,
                    st.sso.is_some(),
                ),
                Err(e) => ApiError::from(e).into_response(),
            };
        }
        Err(e) => return e.into_response(),
    };
    let (cookie, expires_at) = match open_sign_in(&st, &user, &headers).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let details = serde_json::json!({"expires_at": expires_at});
    crate::audit::record(
        &st,
        &who.as_actor(&user.name),
        "sign_in",
        &user.name,
        details,
    )
    .await;
    let mut resp = Redirect::to("/runs").into_response();
    if let Some(c) = cookie {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    resp
}

/// Makes a sign-in for `user` (a key's or single sign-on's): its cookie and its expiry.
pub(super) async fn open_sign_in(
    st: &AppState,
    user: &sandboxd_core::store::User,
    headers: &HeaderMap,
) -> Result<(Option<HeaderValue>, i64), ApiError> {
    let token = random_token();
    let now = now_ms();
    let lasts_until = now.saturating_add(st.config.server.sign_in_ms());
    let expires_at = user.expires_at.map_or(lasts_until, |e| e.min(lasts_until));
    st.store
        .add_login(NewLogin {
            token_hash: token_hash(&token),
            user_id: user.id.clone(),
            csrf: random_token(),
            created_at: now,
            expires_at,
        })
        .await?;
    let cookie = set_cookie(&token, (expires_at - now) / 1000, is_https(headers));
    Ok((cookie, expires_at))
}

#[derive(Deserialize)]
pub struct LogoutForm {
    csrf: String,
}

/// POST /logout: ends the sign-in (its CSRF token is in the form) and clears the cookie.
pub async fn logout(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let headers = req.headers().clone();
    let login = match from_cookie(&st, &headers).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    if let Some((login, hash)) = login {
        let form =
            <Form<LogoutForm> as axum::extract::FromRequest<()>>::from_request(req, &()).await;
        let ok =
            check_origin(&headers).is_ok() && form.is_ok_and(|Form(f)| same(&f.csrf, &login.csrf));
        if !ok {
            return ApiError::new(
                ErrorCode::CsrfFailed,
                "sign out from the page's button (the form carries the CSRF token)",
            )
            .into_response();
        }
        if let Err(e) = st.store.remove_login(hash).await {
            return ApiError::from(e).into_response();
        }
        // What this sign-in opened (the run page's event stream) ends with it.
        st.streams
            .revoke_credential(&login.user.id, Credential::SignIn(hash), Revoked::SignedOut);
    }
    let mut resp = Redirect::to("/login").into_response();
    if let Some(c) = set_cookie("", 0, is_https(&headers)) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sandboxd_session=tok; b=2"),
        );
        assert_eq!(cookie_token(&h), Some("tok"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("xsandboxd_session=t"),
        );
        assert_eq!(cookie_token(&h), None);
    }

    #[test]
    fn origin_must_be_this_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(
            check_origin(&h).is_ok(),
            "no Origin: not a browser's cross-site request"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(check_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(check_origin(&h).is_err());
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(check_origin(&h).is_err());
    }

    #[test]
    fn the_cookie_is_strict_and_http_only() {
        let c = set_cookie("t", 60, true).unwrap();
        let c = c.to_str().unwrap();
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Max-Age=60",
            "Secure",
            "Path=/",
        ] {
            assert!(c.contains(part), "{c}");
        }
        assert!(
            !set_cookie("t", 60, false)
                .unwrap()
                .to_str()
                .unwrap()
                .contains("Secure")
        );
    }
}
