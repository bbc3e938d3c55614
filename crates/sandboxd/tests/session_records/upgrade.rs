//! serve keeps its tool records in its store; an earlier version kept them as files in the
//! data directory (`<data>/runs/sessions/<id>.<kind>.json`). serve's start moves the files
//! of the sessions its store names into the store, byte for byte, and deletes them; the
//! moved undo history works (undo_edit through the API undoes an edit made before the
//! upgrade). A kept CLI session's files, whose container runs, stay the CLI's; a file of a
//! session with no container is swept, as serve's start always did. The move is one-time
//! and idempotent: a file a cut-short move left behind loses to the store's record.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::time::Duration;

use reqwest::Method;
use sandboxd_core::store::ToolRecords as _;
use serde_json::json;

use super::{edit_through_the_api, records};
use crate::serve::{Api, Env};
use crate::support;
use crate::support::cli::kept_session_id;

/// Writes a record file as an earlier version did.
fn write_record_file(env: &Env, id: &str, kind: &str, bytes: &[u8]) {
    let dir = env.dir.path().join("data/runs/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{id}.{kind}.json")), bytes).unwrap();
}

/// The `kind` record serve's store holds for runtime session `id`.
async fn stored(env: &Env, id: &str, kind: &str) -> Option<Vec<u8>> {
    env.store().await.record(id, kind).await.unwrap()
}

#[tokio::test]
async fn serves_start_moves_an_earlier_versions_record_files_into_its_store_once() {
    let env = Env::new("").await;
    let key = env.add_user("ann", &[]);
    let data = env.dir.path().join("data");
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    edit_through_the_api(&api, &id).await;
    let rt = env.runtime_id(&id).await;
    assert_eq!(
        records(&data, &rt),
        Vec::<String>::new(),
        "serve writes no files"
    );
    serve.sigterm(Duration::from_secs(30));

    // What an earlier version left: the undo record as a file and none in the store; a kept
    // CLI session's record file; the file of a session that has no container anywhere.
    let bytes = stored(&env, &rt, "undo").await.unwrap();
    assert!(env.store().await.clear_record(&rt, "undo").await.unwrap());
    write_record_file(&env, &rt, "undo", &bytes);
    let create = json!({"command": "create", "path": "/workspace/c.txt", "file_text": "c\n"});
    let out = env
        .cmd()
        .args(["tool", "--keep", "str_replace_editor", &create.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cli = kept_session_id(&String::from_utf8_lossy(&out.stderr));
    let _cleanup = support::cli::cleanup(&cli);
    write_record_file(&env, "0123456789ab", "plans", b"{}");

    let mut serve = env.start();
    assert_eq!(records(&data, &rt), Vec::<String>::new(), "the file moved");
    assert_eq!(
        stored(&env, &rt, "undo").await.as_deref(),
        Some(&bytes[..]),
        "byte for byte"
    );
    assert_eq!(
        records(&data, &cli),
        ["undo"],
        "the CLI session's file stays"
    );
    assert_eq!(env.stored_records(&cli).await, Vec::<String>::new());
    assert_eq!(
        records(&data, "0123456789ab"),
        Vec::<String>::new(),
        "an orphan's file is swept"
    );

    // The moved history is the session's: undoing the creation removes the file.
    let api = Api::new(&serve, &key);
    let undo = json!({"command": "undo_edit", "path": "/workspace/a.txt"});
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/str_replace_editor"),
            Some(undo),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["is_error"], false, "{v}");
    assert!(v["output"].as_str().unwrap().contains("removed"), "{v}");
    let ls = api.exec(&id, "ls /workspace").await;
    assert!(!ls.to_string().contains("a.txt"), "{ls}");

    // A file a cut-short move left beside the store's record: the store's wins, the file goes.
    serve.sigterm(Duration::from_secs(30));
    let now = stored(&env, &rt, "undo").await.unwrap();
    assert_ne!(now, bytes, "the undo changed the record");
    write_record_file(&env, &rt, "undo", &bytes);
    let _serve = env.start();
    assert_eq!(records(&data, &rt), Vec::<String>::new());
    assert_eq!(
        stored(&env, &rt, "undo").await,
        Some(now),
        "the store's record stays"
    );
}
