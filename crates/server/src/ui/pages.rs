//! The pages' HTML: a shell (header, navigation, sign-out form, the CSRF token in a
//! `<meta>`) around each page's skeleton. The skeletons hold no data from the model or the
//! sandbox; the page's script fills them from the API. The only values interpolated here
//! are the user's name and ids, escaped.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::html::esc;
use sandboxd_core::store::Login;

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{} · sandboxd</title><link rel=\"stylesheet\" href=\"/assets/app.css\">",
        esc(title)
    )
}

/// A signed-in page: `page` names the script's view, `data` its attributes (already escaped).
fn shell(
    login: &Login,
    title: &str,
    page: &str,
    data: &str,
    main: &str,
    status: StatusCode,
) -> Response {
    let admin = if login.user.admin {
        "<a href=\"/admin\">Admin</a>"
    } else {
        ""
    };
    html(
        status,
        format!(
            "{head}<meta name=\"csrf-token\" content=\"{csrf}\"><script src=\"/assets/app.js\" defer></script><script src=\"/assets/run.js\" defer></script><script src=\"/assets/views.js\" defer></script></head>\
<body data-page=\"{page}\" data-admin=\"{is_admin}\"{data}><header class=\"top\"><a class=\"brand\" href=\"/runs\">sandboxd</a><nav><a href=\"/runs\">Runs</a>{admin}</nav>\
<form class=\"signout\" method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><span class=\"who\">{name}</span> <button type=\"submit\">Sign out</button></form></header>\
<main id=\"main\">{main}</main><div id=\"toast\" role=\"status\" aria-live=\"polite\"></div></body></html>",
            head = head(title),
            csrf = esc(&login.csrf),
            page = esc(page),
            is_admin = login.user.admin,
            name = esc(&login.user.name),
        ),
    )
}

/// The sign-in page: the key form, and a single sign-on link when `[sso]` is configured.
pub fn login_page(error: Option<&str>, status: StatusCode) -> Response {
    login_page_with(error, status, false)
}

pub fn login_page_with(error: Option<&str>, status: StatusCode, sso: bool) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(e)))
        .unwrap_or_default();
    let sso = if sso {
        "<p class=\"sso\"><a class=\"button\" id=\"sso\" href=\"/login/sso\">Sign in with single sign-on</a></p>"
    } else {
        ""
    };
    html(
        status,
        format!(
            "{}</head><body class=\"login\"><main><h1>sandboxd</h1><form method=\"post\" action=\"/login\"><label for=\"key\">API key</label>\
<input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" placeholder=\"sbx_…\" required autofocus>{error}<button type=\"submit\">Sign in</button></form>{sso}\
<p class=\"hint\">An admin creates keys with <code>sandboxd users add NAME</code> or on the admin page.</p></main></body></html>",
            head("Sign in")
        ),
    )
}

/// The page that ends a single sign-on: the browser goes on to `to` by itself (the page's own
/// navigation, so the SameSite=Strict sign-in cookie goes with it).
pub fn continue_page(to: &str) -> Response {
    html(
        StatusCode::OK,
        format!(
            "{}<meta http-equiv=\"refresh\" content=\"0;url={to}\"></head><body class=\"login\"><main><h1>sandboxd</h1><p>Signed in. <a id=\"continue\" href=\"{to}\">Continue</a></p></main></body></html>",
            head("Signed in"),
            to = esc(to)
        ),
    )
}

pub fn not_found(login: &Login, what: &str) -> Response {
    shell(
        login,
        "Not found",
        "none",
        "",
        &format!(
            "<h1>Not found</h1><p>There is no {} here for you. <a href=\"/runs\">Your runs</a></p>",
            esc(what)
        ),
        StatusCode::NOT_FOUND,
    )
}

pub fn runs(login: &Login) -> Response {
    let filter = if login.user.admin {
        "<label>User <select id=\"owner-filter\"><option value=\"\">everyone</option></select></label>"
    } else {
        ""
    };
    shell(
        login,
        "Runs",
        "runs",
        "",
        &format!(
            "<section class=\"panel\"><h1>New task</h1><form id=\"new-run\"><label for=\"task\">Task</label><textarea id=\"task\" name=\"task\" rows=\"3\" required></textarea>\
<div class=\"row\"><label>Session <select id=\"session\"><option value=\"\">a new session</option></select></label>\
<label>Mode <select id=\"mode\"><option value=\"agent\">agent</option><option value=\"plan\">plan</option></select></label>\
<label>Agent <select id=\"agent\"><option value=\"general\">general</option></select></label>\
<label>Files for /workspace <input id=\"files\" type=\"file\" multiple></label></div><button type=\"submit\" disabled>Start</button></form></section>\
<section class=\"panel\"><div class=\"row between\"><h1>Runs</h1>{filter}</div><div class=\"scroll\"><table class=\"list\"><thead><tr><th>Task</th><th>State</th><th>Started</th><th>Duration</th><th>Steps</th><th>Tokens</th></tr></thead><tbody id=\"runs\"></tbody></table></div>\
<button id=\"more\" hidden>More</button></section>"
        ),
        StatusCode::OK,
    )
}

pub fn run(login: &Login, id: &str) -> Response {
    shell(
        login,
        "Run",
        "run",
        &format!(" data-run=\"{}\"", esc(id)),
        "<section class=\"runhead\" id=\"runhead\"><div class=\"row between\"><h1 id=\"run-title\">Run</h1><div class=\"row\"><span id=\"state\" class=\"badge\">loading</span>\
<button id=\"stop\" class=\"danger\" hidden>Stop</button></div></div><div class=\"meta\"><span id=\"usage\">0 + 0 tokens</span> · <span id=\"steps\">0 steps</span> · <a id=\"files-link\" href=\"#\">Files</a> · <span id=\"live\">connecting…</span></div></section>\
<section id=\"timeline\" class=\"timeline\" aria-live=\"polite\"></section>\
<form id=\"answer-box\" class=\"panel\" hidden><label for=\"answer\" id=\"question\">The agent asks</label><textarea id=\"answer\" rows=\"2\" required></textarea><button type=\"submit\">Answer</button></form>\
<form id=\"follow-up\" class=\"panel\" hidden><label for=\"follow\">Follow-up in the same session</label><textarea id=\"follow\" rows=\"2\" required></textarea><button type=\"submit\">Send</button></form>",
        StatusCode::OK,
    )
}

pub fn files(login: &Login, session: &str) -> Response {
    shell(
        login,
        "Files",
        "files",
        &format!(" data-session=\"{}\"", esc(session)),
        "<section class=\"panel\"><div class=\"row between\"><h1>/workspace</h1><a id=\"archive\" class=\"button\" href=\"#\" download=\"workspace.tar\">Download all (tar)</a></div>\
<div class=\"files\"><nav id=\"tree\" class=\"tree\" aria-label=\"Files\"></nav><div id=\"viewer\" class=\"viewer\"><p class=\"hint\">Choose a file.</p></div></div></section>\
<section class=\"panel\"><h1>Egress</h1><p id=\"egress-summary\" class=\"hint\"></p><div class=\"scroll\"><table class=\"list\"><thead><tr><th>Started</th><th>Destination</th><th>Rule</th><th>Bytes up / down</th></tr></thead><tbody id=\"egress\"></tbody></table></div></section>",
        StatusCode::OK,
    )
}

pub fn admin(login: &Login) -> Response {
    shell(
        login,
        "Admin",
        "admin",
        "",
        "<section class=\"panel\"><h1>Users</h1><form id=\"add-user\" class=\"row\"><label>Name <input id=\"new-name\" required pattern=\"[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}\"></label>\
<label><input id=\"new-admin\" type=\"checkbox\"> admin</label><button type=\"submit\">Add user</button></form><div id=\"new-key\" class=\"key\" hidden></div>\
<div class=\"scroll\"><table class=\"list\"><thead><tr><th>Name</th><th>Admin</th><th>Key</th><th>Sessions</th><th>Runs</th><th>Tokens today</th><th>CPU-s today</th><th></th></tr></thead><tbody id=\"users\"></tbody></table></div></section>\
<section class=\"panel\"><h1>Live sessions</h1><div class=\"scroll\"><table class=\"list\"><thead><tr><th>Session</th><th>Owner</th><th>Age</th><th>Idle</th><th></th></tr></thead><tbody id=\"sessions\"></tbody></table></div></section>\
<section class=\"panel\"><h1>Usage</h1><p class=\"hint\">The last 30 days (UTC) per user; <a href=\"/v1/usage?format=csv\" download=\"usage.csv\">export the days as CSV</a>.</p><div class=\"scroll\"><table class=\"list\"><thead><tr><th>User</th><th>CPU s</th><th>Memory GiB·s</th><th>Alive s</th><th>Bytes in / out</th><th>Tool calls</th><th>Tokens in / out</th><th>CPU s per day</th></tr></thead><tbody id=\"usage\"></tbody></table></div></section>\
<section class=\"panel\"><h1>Audit log</h1><p class=\"hint\">The newest 100 entries; <a href=\"/v1/audit?format=jsonl\" download=\"audit.jsonl\">export all as JSON lines</a>.</p><div class=\"scroll\"><table class=\"list\"><thead><tr><th>When</th><th>Actor</th><th>Action</th><th>Target</th><th>Client</th><th>Details</th></tr></thead><tbody id=\"audit\"></tbody></table></div></section>\
<section class=\"panel\"><h1>Ended sessions</h1><p class=\"hint\">Their runs and events stay until the retention period.</p><div class=\"scroll\"><table class=\"list\"><thead><tr><th>Session</th><th>Owner</th><th>Ended</th><th>Why</th><th></th></tr></thead><tbody id=\"ended-sessions\"></tbody></table></div></section>",
        StatusCode::OK,
    )
}
