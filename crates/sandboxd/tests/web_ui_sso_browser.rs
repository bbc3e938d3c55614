//! Single sign-on in a real browser (Debian's chromium, headless, see support/web_browser.rs)
//! against `oidc-provider-mock` and a real `sandboxd serve` (web_ui_sso.rs starts both): the
//! sign-in page's single sign-on button, the provider's own authorization form filled in and
//! submitted, the runs page signed in as the user with the admin link the group claim gives;
//! signing out ends the cookie session.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::Duration;

use serde_json::json;

use crate::web_ui_sso::{Provider, sso_config, start_serve};
use serve::Env;
use support::web_browser::{WebBrowser, click, eval, goto, type_into, wait_for};

#[tokio::test(flavor = "multi_thread")]
async fn a_real_browser_signs_in_through_the_providers_form() {
    let provider = Provider::start(3600).await;
    let env = Env::new(&sso_config(&provider.base, "")).await;
    let serve = start_serve(&env);
    provider
        .set_user(
            "sub-fay",
            json!({"preferred_username": "fay", "groups": ["sandboxd-admins"]}),
        )
        .await;
    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    goto(&page, &serve.url("/login")).await;
    click(&page, "#sso").await;
    wait_for(
        &page,
        "document.querySelector('input[name=sub]') !== null",
        Duration::from_secs(20),
        "the provider's authorization form",
    )
    .await;
    type_into(&page, "input[name=sub]", "sub-fay").await;
    click(&page, "form button[type=submit]").await;
    wait_for(
        &page,
        "location.pathname === '/runs' && document.querySelector('.who')?.textContent === 'fay'",
        Duration::from_secs(20),
        "the runs page, signed in as fay",
    )
    .await;
    let admin_link = eval(
        &page,
        "document.querySelector('nav a[href=\"/admin\"]') !== null",
    )
    .await;
    assert_eq!(admin_link, true, "fay is an admin by the group claim");
    // Sign-out ends the cookie session: the runs page sends the browser to sign in.
    click(&page, "form.signout button").await;
    wait_for(
        &page,
        "location.pathname === '/login'",
        Duration::from_secs(20),
        "the sign-in page after signing out",
    )
    .await;
    goto(&page, &serve.url("/runs")).await;
    wait_for(
        &page,
        "location.pathname === '/login'",
        Duration::from_secs(20),
        "signed out: /runs sends to /login",
    )
    .await;
}
