//! `sandboxd egress credentials list|set|remove --user NAME` on the store (issue 24): the
//! value comes from standard input or the variable `--value-env` names, never from argv,
//! and is never printed; a listing (table or JSON, and the API's own listing of a running
//! serve) has the host and header, never the value; remove takes it away; the API's checks
//! apply (no key configured, a host outside the user's quota, an unknown user, an empty
//! value, a terminal is never read). That the credential reaches a session is
//! serve_egress_ca.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::io::Write;
use std::process::{Output, Stdio};

use reqwest::Method;

use crate::serve::{Api, Env};
use crate::serve_egress_user_creds::key_file;

/// `sandboxd egress credentials ARGS` with `stdin` piped and `vars` set.
fn run(env: &Env, args: &[&str], stdin: &str, vars: &[(&str, &str)]) -> Output {
    let mut cmd = env.cmd();
    cmd.args(["egress", "credentials"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn set_list_and_remove_never_show_the_value() {
    let secret = format!("sk-cli-{:032x}", rand::random::<u128>());
    let other = format!("sk-env-{:032x}", rand::random::<u128>());
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let env = Env::new(&format!(
        "[egress]\nwidest = \"*.example.com\"\ncredential_key_file = {:?}\n",
        key.display().to_string()
    ))
    .await;
    let ann_key = env.add_user("ann", &[]);
    env.add_user("bob", &["--egress", "a.example.com"]);
    let mut seen = String::new();

    let set = run(
        &env,
        &[
            "set",
            "a.example.com",
            "--user",
            "ann",
            "--header",
            "Authorization",
            "--prefix",
            "Bearer ",
        ],
        &format!("{secret}\n"),
        &[],
    );
    assert!(set.status.success(), "{}", text(&set));
    assert!(
        text(&set).contains("attached ann's credential for a.example.com"),
        "{}",
        text(&set)
    );
    seen.push_str(&text(&set));
    let set = run(
        &env,
        &[
            "set",
            "b.example.com",
            "--user",
            "ann",
            "--header",
            "X-Api-Key",
            "--value-env",
            "MY_SECRET",
        ],
        "",
        &[("MY_SECRET", &other)],
    );
    assert!(set.status.success(), "{}", text(&set));
    seen.push_str(&text(&set));

    let list = run(&env, &["list", "--user", "ann"], "", &[]);
    assert!(list.status.success(), "{}", text(&list));
    let table = text(&list);
    for needle in [
        "a.example.com",
        "Authorization",
        "\"Bearer \"",
        "b.example.com",
        "X-Api-Key",
    ] {
        assert!(table.contains(needle), "{needle}: {table}");
    }
    seen.push_str(&table);
    let list = run(&env, &["list", "--user", "ann", "--json"], "", &[]);
    let json: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json[0]["host"], "a.example.com", "{json}");
    seen.push_str(&text(&list));
    // A running serve reads the same rows: ann's own listing on the API.
    let serve = env.start();
    let (s, v) = Api::new(&serve, &ann_key)
        .json(Method::GET, "/v1/egress/credentials", None)
        .await;
    assert_eq!((s, v.as_array().map(Vec::len)), (200, Some(2)), "{v}");
    seen.push_str(&v.to_string());
    drop(serve);

    // What is refused, and says why.
    for (args, stdin, why) in [
        (
            &["set", "c.example.com", "--user", "nobody", "--header", "H"][..],
            "v\n",
            "no user named",
        ),
        (
            &["set", "a.example.com", "--user", "bob", "--header", "H"][..],
            "",
            "value is empty",
        ),
        (
            &["set", "example.org", "--user", "ann", "--header", "H"][..],
            "v\n",
            "widest",
        ),
        (
            &["set", "b.example.com", "--user", "bob", "--header", "H"][..],
            "v\n",
            "quota",
        ),
        (
            &[
                "set",
                "a.example.com",
                "--user",
                "ann",
                "--header",
                "H",
                "--value-env",
                "UNSET_VAR_X",
            ][..],
            "",
            "UNSET_VAR_X",
        ),
        (
            &["remove", "c.example.com", "--user", "ann"][..],
            "",
            "no egress credential",
        ),
    ] {
        let out = run(&env, args, stdin, &[]);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(why), "{args:?}: {}", text(&out));
    }

    let rm = run(&env, &["remove", "a.example.com", "--user", "ann"], "", &[]);
    assert!(rm.status.success(), "{}", text(&rm));
    let list = run(&env, &["list", "--user", "ann", "--json"], "", &[]);
    let json: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json[0]["host"], "b.example.com", "{json}");
    seen.push_str(&text(&rm));
    for value in [&secret, &other] {
        assert!(
            !seen.contains(value.as_str()),
            "a value was printed: {seen}"
        );
    }

    // Without a key configured: refused, saying how to set one.
    let env = Env::new("").await;
    env.add_user("ann", &[]);
    let out = run(
        &env,
        &["set", "a.example.com", "--user", "ann", "--header", "H"],
        "v\n",
        &[],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("credential_key_file"), "{}", text(&out));
}
