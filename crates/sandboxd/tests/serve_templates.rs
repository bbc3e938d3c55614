//! Issue 25, templates: an admin's `[[templates]]` entry with one extra Debian package (jq,
//! small and cheap to install) is built offline by `sandboxd image build --template`, shows
//! in `sandboxd image status`, and is chosen by name from `/v1` and from `sandboxd exec`: its
//! binary exists there and not in a default session; an unknown name is refused with the
//! known ones listed, never silently the default.
//!
//! The first run builds the template's image (the default recipe's mmdebstrap plus jq, a
//! minute or two); later runs find it by its content hash.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::json;

use serve::{Api, Env, code};

const TEMPLATE: &str = "[[templates]]\nname = \"jq\"\npackages = [\"jq\"]\n";

fn run(env: &Env, args: &[&str]) -> (bool, String, String) {
    let out = env
        .cmd()
        .env("SANDBOXD_IMAGE_KEEP_OLD", "1")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_template_is_built_offline_and_chosen_by_name() {
    let env = Env::new(TEMPLATE).await;
    let (ok, out, err) = run(&env, &["image", "build", "--template", "jq"]);
    assert!(ok, "image build --template jq: {out}\n{err}");
    assert!(out.contains("sandboxd/sandbox:tpl-jq-"), "{out}");
    let (_, status, err) = run(&env, &["image", "status"]);
    let line = status
        .lines()
        .find(|l| l.starts_with("jq: "))
        .unwrap_or_else(|| panic!("{status}{err}"));
    assert!(line.ends_with("is present"), "{status}");
    assert!(
        status.lines().any(|l| l.starts_with("default: ")),
        "{status}"
    );
    let (ok, _, err) = run(&env, &["image", "build", "--template", "nope"]);
    assert!(!ok && err.contains("the templates are: jq"), "{err}");

    let key = env.add_user("tess", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"template": "jq"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let with = v["id"].as_str().unwrap().to_string();
    let out = api.exec(&with, "echo '{\"a\": 41}' | jq '.a + 1'").await;
    assert_eq!(
        (out["exit_code"].as_i64(), out["stdout"].as_str()),
        (Some(0), Some("42\n")),
        "{out}"
    );
    // The rest of the default image is there too: the template is built on top of it.
    let out = api
        .exec(
            &with,
            "python3 -c 'import pandas' && test -x /usr/local/lib/sandboxd/init.sh",
        )
        .await;
    assert_eq!(out["exit_code"], 0, "{out}");

    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"template": "default"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let plain = v["id"].as_str().unwrap().to_string();
    let out = api.exec(&plain, "command -v jq").await;
    assert_eq!(out["exit_code"], 1, "jq is not in a default session: {out}");

    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"template": "nope"})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("no template \"nope\"") && msg.contains("default, jq"),
        "{msg}"
    );

    // The command line chooses by the same names.
    let (ok, out, err) = run(&env, &["exec", "--template", "jq", "--", "jq", "--version"]);
    assert!(ok && out.starts_with("jq-"), "{out}\n{err}");
    let (ok, _, err) = run(&env, &["exec", "--template", "nope", "--", "true"]);
    assert!(!ok && err.contains("default, jq"), "{err}");
}
