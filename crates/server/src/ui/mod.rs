//! The web UI, served by `sandboxd serve` at `/`: server-rendered page skeletons
//! (`pages`), three small plain-JS files and a stylesheet embedded in the binary
//! (`assets/`), sign-in by API key or single sign-on (`sso`) into a session cookie with CSRF
//! protection (`login`),
//! and the server-side rendering the page's script asks for: run events to HTML fragments
//! (`render`, with `markdown` and `ansi`) and sandboxed previews of HTML files (a download
//! unless loaded into a frame: `frame_or_attachment`).
//!
//! The page's script talks to the ordinary /v1 API (the cookie authenticates it, see
//! `auth::require_user`), so the UI composes no flow of its own. Every response carries a
//! strict Content-Security-Policy (`script-src 'self'`, no inline script or style),
//! `nosniff`, `frame-ancestors 'none'` and `Referrer-Policy: same-origin` (no-referrer would make browsers send `Origin: null` on our own POSTs, which the CSRF check refuses) (`security_headers`).

pub mod ansi;
pub mod html;
pub mod login;
pub mod markdown;
pub mod pages;
pub mod render;
pub mod sso;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorCode};
use super::file_paths::workspace_path;
use super::sessions::{live_session, owned_row, sandbox_failed};
use super::types::PathQuery;
use sandboxd_core::store::Login;

/// The policy of every page and API answer that sets none of its own.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";
/// The policy of a previewed HTML file: an opaque origin (no cookies, no API), no script,
/// no top navigation, nothing loaded from anywhere; framed only by our own page.
const PREVIEW_CSP: &str =
    "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'self'";
/// Render requests carry many events (a long run's replay); the page splits bigger ones.
const RENDER_BODY_LIMIT: usize = 8 << 20;

type Shared = Arc<AppState>;

/// The signed-in user of a page (and their cookie token's hash); without a live sign-in, a
/// redirect to /login.
pub struct PageUser(pub Login, [u8; 32]);

impl PageUser {
    fn caller(&self) -> Caller {
        Caller {
            user: Arc::new(self.0.user.clone()),
            credential: super::auth::Credential::SignIn(self.1),
            who: crate::audit::Who {
                actor: self.0.user.name.clone(),
                ..Default::default()
            },
        }
    }
}

impl FromRequestParts<Shared> for PageUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &Shared) -> Result<Self, Response> {
        match login::from_cookie(st, &parts.headers).await {
            Ok(Some((l, hash))) => Ok(PageUser(l, hash)),
            Ok(None) => Err(Redirect::to("/login").into_response()),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// The UI's routes (pages, assets, sign-in, render and preview).
pub fn router() -> Router<Shared> {
    Router::new()
        .route("/", get(home))
        .route("/login", get(login_form).post(login::login))
        .route("/logout", post(login::logout))
        .route("/login/sso", get(sso::start))
        .route("/login/sso/callback", get(sso::callback))
        .route("/runs", get(runs_page))
        .route("/runs/{id}", get(run_page))
        .route("/sessions/{id}/files", get(files_page))
        .route("/admin", get(admin_page))
        .route("/assets/{name}", get(asset))
        .route(
            "/ui/preview/{id}",
            get(preview).layer(axum::middleware::from_fn(frame_or_attachment)),
        )
        .route(
            "/ui/render",
            post(render_events).layer(DefaultBodyLimit::max(RENDER_BODY_LIMIT)),
        )
}

async fn home(State(st): State<Shared>, headers: HeaderMap) -> Response {
    match login::from_cookie(&st, &headers).await {
        Ok(Some(_)) => Redirect::to("/runs").into_response(),
        Ok(None) => Redirect::to("/login").into_response(),
        Err(e) => e.into_response(),
    }
}

async fn login_form(State(st): State<Shared>) -> Response {
    pages::login_page_with(None, StatusCode::OK, st.sso.is_some())
}

async fn runs_page(user: PageUser) -> Response {
    pages::runs(&user.0)
}

async fn run_page(
    State(st): State<Shared>,
    user: PageUser,
    ApiPath(id): ApiPath<String>,
) -> Response {
    // Another user's run and a missing one look the same: a 404 page (ids are short; a
    // longer one cannot exist).
    let row = if id.len() > 128 {
        None
    } else {
        match st.store.run(&id).await {
            Ok(r) => r,
            Err(e) => return ApiError::from(e).into_response(),
        }
    };
    match row {
        Some(r) if user.caller().owns(&r.owner) => pages::run(&user.0, &id),
        _ => pages::not_found(&user.0, "run"),
    }
}

async fn files_page(
    State(st): State<Shared>,
    user: PageUser,
    ApiPath(id): ApiPath<String>,
) -> Response {
    match owned_row(&st, &user.caller(), &id).await {
        Ok(_) => pages::files(&user.0, &id),
        Err(e) if e.code() == ErrorCode::NotFound => pages::not_found(&user.0, "session"),
        Err(e) => e.into_response(),
    }
}

async fn admin_page(user: PageUser) -> Response {
    if user.0.user.admin {
        pages::admin(&user.0)
    } else {
        pages::not_found(&user.0, "page")
    }
}

async fn asset(ApiPath(name): ApiPath<String>) -> Response {
    let (body, mime): (&'static str, &'static str) = match name.as_str() {
        "app.js" => (
            include_str!("assets/app.js"),
            "text/javascript; charset=utf-8",
        ),
        "run.js" => (
            include_str!("assets/run.js"),
            "text/javascript; charset=utf-8",
        ),
        "views.js" => (
            include_str!("assets/views.js"),
            "text/javascript; charset=utf-8",
        ),
        "app.css" => (include_str!("assets/app.css"), "text/css; charset=utf-8"),
        _ => {
            return ApiError::new(ErrorCode::NotFound, format!("no asset {name:?}"))
                .into_response();
        }
    };
    (
        [
            (header::CONTENT_TYPE, mime),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An HTML file of the session's /workspace, for a sandboxed `<iframe>` of the files page.
async fn preview(
    State(st): State<Shared>,
    user: PageUser,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let path = workspace_path(&q.path)?;
    let caller = user.caller();
    let live = live_session(&st, &caller, &id).await?;
    let _permit = st.transfers.start(caller.id())?;
    // Capped, never read whole: a page of more than PREVIEW_MAX is not for reading in a frame.
    let bytes = match live.sandbox.read_head(&path, PREVIEW_MAX).await {
        Ok((head, size)) if size <= head.len() as u64 => head,
        Ok((_, size)) => too_big_to_preview(size),
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    let mut resp = (StatusCode::OK, bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PREVIEW_CSP),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        HeaderValue::from_static("SAMEORIGIN"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// A preview opened as a page of its own (a link someone was sent, a typed URL) would show
/// model-made HTML on the service's own origin, a ready phishing page; so it is a download
/// unless the browser says it loads it into a frame (`Sec-Fetch-Dest: iframe` or `frame`, a
/// header pages cannot set). The files page's `<iframe>` sends it; browsers send Sec-Fetch-*
/// only to https and loopback origins, so over plain http elsewhere previews download.
async fn frame_or_attachment(req: Request, next: Next) -> Response {
    let framed = matches!(
        req.headers()
            .get("sec-fetch-dest")
            .and_then(|v| v.to_str().ok()),
        Some("iframe" | "frame")
    );
    let name = attachment_name(req.uri().query().unwrap_or(""));
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("Sec-Fetch-Dest"));
    if !framed && resp.status().is_success() {
        let value = format!("attachment; filename=\"{name}\"");
        if let Ok(v) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
        }
    }
    resp
}

/// The file name of a preview's `?path=` for its download: the last component, only
/// `[A-Za-z0-9._-]` kept (it goes into a quoted header parameter), `preview.html` if nothing is left.
fn attachment_name(query: &str) -> String {
    let path = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "path")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or("");
    let kept: String = last
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(100)
        .collect();
    if kept.trim_matches('.').is_empty() {
        "preview.html".into()
    } else {
        kept
    }
}

/// The largest HTML file the UI previews; a bigger one gets a note instead.
const PREVIEW_MAX: usize = 4 << 20;

/// The note shown in place of an HTML file over `PREVIEW_MAX`.
fn too_big_to_preview(size: u64) -> Vec<u8> {
    format!(
        "<!doctype html><meta charset=\"utf-8\"><p>This file is {size} bytes; previews stop at {} MiB. Download it to read it.</p>",
        PREVIEW_MAX >> 20
    )
    .into_bytes()
}

/// POST /ui/render: run events (as the page got them) to timeline fragments.
async fn render_events(
    user: PageUser,
    headers: HeaderMap,
    ApiJson(req): ApiJson<render::RenderRequest>,
) -> Result<Json<render::RenderResponse>, ApiError> {
    login::check_csrf(&headers, &user.0)?;
    if req.events.len() > render::MAX_EVENTS {
        return Err(ApiError::invalid(format!(
            "field `events`: at most {} per request",
            render::MAX_EVENTS
        )));
    }
    Ok(Json(render::render(&req)))
}

/// Sets the security headers on every response that did not set its own.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    let defaults: [(HeaderName, &'static str); 5] = [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in defaults {
        if !h.contains_key(&name) {
            h.insert(name, HeaderValue::from_static(value));
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::attachment_name;

    #[test]
    fn a_previews_download_name_is_its_file_name_made_header_safe() {
        assert_eq!(attachment_name("path=report.html"), "report.html");
        assert_eq!(
            attachment_name("path=%2Fworkspace%2Fout%2Fa%20b.html"),
            "ab.html"
        );
        assert_eq!(
            attachment_name("path=x%22%3B%20filename%3Devil.exe"),
            "xfilenameevil.exe"
        );
        assert_eq!(attachment_name("path=..%2F.."), "preview.html");
        assert_eq!(attachment_name(""), "preview.html");
    }
}
