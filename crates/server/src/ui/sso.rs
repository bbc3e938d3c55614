//! Single sign-on to the web UI (`[sso]`): `GET /login/sso` sends the browser to the OpenID
//! Connect provider, `GET /login/sso/callback` brings it back signed in.
//!
//! The attempt (the SHA-256 of its state, the PKCE verifier and the nonce) is kept in the
//! store for ten minutes, so the callback may reach any replica, and is taken by the first
//! callback that names it: a replayed callback finds nothing. The state is also set in an
//! HttpOnly cookie (SameSite=Lax, so it comes back on the provider's top-level redirect, and
//! only to /login/sso) that the callback must carry: a callback started in another browser
//! (login CSRF) is refused. A verified identity names the user by `user_claim`; an unknown one
//! is created when `create_users` allows (with a random key nobody is shown: an admin rotating
//! it gives them one for scripts); with `admin_group` set, membership in `groups_claim` makes
//! them an admin and its absence not. Then the same cookie sign-in as a key's. Every success
//! and failure is audited as a key sign-in is, with `via: "sso"` and the reason.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{login, pages};
use crate::AppState;
use crate::audit::Who;
use crate::sso::{Identity, Provider};
use sandboxd_core::store::{QuotaOverride, SsoState, User, now_ms};

const STATE_COOKIE: &str = "sandboxd_sso";
/// How long the provider may take to send the browser back.
const ATTEMPT_MS: i64 = 600_000;

fn provider(st: &AppState) -> Option<&Arc<Provider>> {
    st.sso.as_ref()
}

/// This service's callback URL: the configured one, else made from the request's host.
fn redirect_url(p: &Provider, headers: &HeaderMap) -> String {
    if !p.config().redirect_url.is_empty() {
        return p.config().redirect_url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = if login::is_https(headers) {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{host}/login/sso/callback")
}

fn state_cookie(value: &str, max_age_secs: i64, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{STATE_COOKIE}={value}; Path=/login/sso; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}{secure}"
    ))
    .ok()
}

fn cookie_state(headers: &HeaderMap) -> Option<&str> {
    login::cookie_named(headers, STATE_COOKIE)
}

/// GET /login/sso: a new attempt, then a redirect to the provider.
pub async fn start(State(st): State<Arc<AppState>>, who: Who, headers: HeaderMap) -> Response {
    let Some(p) = provider(&st) else {
        return pages::login_page(
            Some("Single sign-on is not configured; sign in with an API key."),
            StatusCode::NOT_FOUND,
        );
    };
    if let Some(refused) = over_limit(&st, &who).await {
        return refused;
    }
    let begun = match p.start(&redirect_url(p, &headers)).await {
        Ok(b) => b,
        Err(e) => return failed(&st, &who, &e.to_string(), StatusCode::BAD_GATEWAY).await,
    };
    let now = now_ms();
    let kept = st
        .store
        .add_sso_state(SsoState {
            state_hash: login::token_hash(&begun.state),
            pkce_verifier: begun.pkce_verifier,
            nonce: begun.nonce,
            created_at: now,
            expires_at: now + ATTEMPT_MS,
        })
        .await;
    if let Err(e) = kept {
        return crate::error::ApiError::from(e).into_response();
    }
    let mut resp = Redirect::to(begun.url.as_str()).into_response();
    if let Some(c) = state_cookie(&begun.state, ATTEMPT_MS / 1000, login::is_https(&headers)) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    resp
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// GET /login/sso/callback: the provider's answer becomes a sign-in, or a page saying why not.
pub async fn callback(
    State(st): State<Arc<AppState>>,
    who: Who,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let Some(p) = provider(&st) else {
        return pages::login_page(
            Some("Single sign-on is not configured; sign in with an API key."),
            StatusCode::NOT_FOUND,
        );
    };
    match identify(&st, p, &headers, q).await {
        Ok(id) => signed_in(&st, &who, &headers, id).await,
        Err(reason) => match over_limit(&st, &who).await {
            Some(refused) => refused,
            None => failed(&st, &who, &reason, StatusCode::UNAUTHORIZED).await,
        },
    }
}

/// The verified identity of a callback, or why there is none.
async fn identify(
    st: &AppState,
    p: &Provider,
    headers: &HeaderMap,
    q: Callback,
) -> Result<Identity, String> {
    if let Some(e) = q.error {
        let more = q.error_description.unwrap_or_default();
        return Err(format!("the identity provider refused: {e} {more}")
            .trim()
            .to_string());
    }
    let (Some(code), Some(state)) = (q.code, q.state) else {
        return Err("the callback has no code or state".into());
    };
    if !cookie_state(headers).is_some_and(|c| login::same(c, &state)) {
        return Err(
            "this sign-in was not started in this browser (state cookie missing or different)"
                .into(),
        );
    }
    let attempt = st
        .store
        .take_sso_state(login::token_hash(&state), now_ms())
        .await
        .map_err(|e| format!("store: {e}"))?
        .ok_or("this sign-in's state is unknown, expired or already used")?;
    p.finish(
        &redirect_url(p, headers),
        &code,
        &attempt.pkce_verifier,
        &attempt.nonce,
    )
    .await
    .map_err(|e| e.to_string())
}

/// The user an identity names: found, or created when allowed; the admin flag set from the
/// groups when `admin_group` is configured. Returns the user and whether it was created.
async fn user_for(
    st: &AppState,
    p: &Provider,
    who: &Who,
    id: &Identity,
) -> Result<(User, bool), String> {
    let cfg = p.config();
    let admin = (!cfg.admin_group.is_empty()).then(|| id.groups.contains(&cfg.admin_group));
    let (mut user, created) = match st.store.user_by_name(&id.name).await {
        Ok(Some(u)) => (u, false),
        Ok(None) if cfg.create_users => {
            crate::accounts::check_name(&id.name).map_err(|e| e.to_string())?;
            let (u, _key) = crate::accounts::add(
                st.store.as_ref(),
                &id.name,
                admin.unwrap_or(false),
                None,
                QuotaOverride::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
            let details =
                serde_json::json!({"via": "sso", "admin": u.admin, "key_prefix": u.key_prefix});
            crate::audit::record(st, &who.as_actor(&u.name), "user.create", &u.name, details).await;
            (u, true)
        }
        Ok(None) => {
            return Err(format!(
                "no user named {:?}, and [sso] create_users is off",
                id.name
            ));
        }
        Err(e) => return Err(format!("store: {e}")),
    };
    if let Some(admin) = admin
        && admin != user.admin
    {
        st.store
            .set_admin(&user.name, admin)
            .await
            .map_err(|e| format!("store: {e}"))?;
        user.admin = admin;
    }
    Ok((user, created))
}

async fn signed_in(st: &AppState, who: &Who, headers: &HeaderMap, id: Identity) -> Response {
    let Some(p) = provider(st) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (user, created) = match user_for(st, p, who, &id).await {
        Ok(u) => u,
        Err(reason) => return failed(st, who, &reason, StatusCode::FORBIDDEN).await,
    };
    let (cookie, expires_at) = match login::open_sign_in(st, &user, headers).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let details = serde_json::json!({
        "via": "sso",
        "subject": id.subject,
        "created": created,
        "admin": user.admin,
        "expires_at": expires_at,
    });
    crate::audit::record(
        st,
        &who.as_actor(&user.name),
        "sign_in",
        &user.name,
        details,
    )
    .await;
    // A page, not a redirect: the sign-in cookie is SameSite=Strict, and a browser does not
    // send it on a redirect chain that began at the provider's site; the page's own
    // navigation to /runs is same-site.
    let mut resp = pages::continue_page("/runs");
    let h = resp.headers_mut();
    if let Some(c) = cookie {
        h.append(header::SET_COOKIE, c);
    }
    if let Some(c) = state_cookie("", 0, login::is_https(headers)) {
        h.append(header::SET_COOKIE, c);
    }
    resp
}

/// Counts an unauthenticated attempt from the caller's address in the window failed keys use
/// (`[server] auth_failures_per_minute`): each start keeps a row in the store for ten minutes,
/// and each failed callback may be a guessed state, so both are bounded per address. The
/// refusal page when the address is over; a valid key still signs in from it.
async fn over_limit(st: &AppState, who: &Who) -> Option<Response> {
    let ip: std::net::IpAddr = who.client.parse().ok()?;
    match st.throttle.failed(ip).await {
        Ok(None) => None,
        Ok(Some(_)) => Some(pages::login_page_with(
            Some("Too many sign-in attempts from your address; wait a minute."),
            StatusCode::TOO_MANY_REQUESTS,
            true,
        )),
        Err(e) => Some(crate::error::ApiError::from(e).into_response()),
    }
}

/// The longest reason kept: part of it (the provider's `error_description`) is the caller's.
const MAX_REASON: usize = 500;

async fn failed(st: &AppState, who: &Who, reason: &str, status: StatusCode) -> Response {
    let reason = match reason.char_indices().nth(MAX_REASON) {
        Some((cut, _)) => &reason[..cut],
        None => reason,
    };
    let details = serde_json::json!({"via": "sso", "reason": reason});
    crate::audit::record(st, who, "sign_in.failed", "-", details).await;
    tracing::warn!(reason, "single sign-on failed");
    pages::login_page_with(
        Some(&format!("Single sign-on failed: {reason}")),
        status,
        st.sso.is_some(),
    )
}
