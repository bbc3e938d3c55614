//! Several `sandboxd serve` replicas on one Postgres and one engine (issue 22), as real
//! processes on loopback with the real image and a fake LLM at the HTTP boundary: any replica
//! answers any request (a user made on one signs in on another, a session made on one is used
//! through the others), a run posted on one is followed on the others exactly once and in
//! order (and resumed on yet another with Last-Event-ID), two runs posted to one session on two
//! replicas at once run one after the other, the per-owner cap holds across replicas, and a
//! replica killed with `kill -9` in the middle of a run loses nothing committed: another
//! marks the run `interrupted` within its lease, the session goes on, and the dead replica,
//! restarted, takes nothing back and removes nothing that lives.
//!
//! Each test makes its own database in the cluster `SANDBOXD_TEST_PG_URL` names (CI starts a
//! throw-away one with scripts/pg-test.sh) and drops it at the end; each replica has its own
//! data directory, as replicas on separate hosts do.

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::serve::runs::{
    Sse, assert_numbered, events, follow_all, get_run, kinds, llm_config, read_sse, start_run,
};
use crate::serve::{Api, Env, Serve, code};
use crate::support::fake_llm::{FakeLlm, Gate, Reply};

/// A database of its own in the test cluster, dropped (connections and all) at the end.
struct Db {
    admin: String,
    name: String,
    url: String,
}

impl Db {
    /// None when the Postgres tests are skipped on purpose (`SANDBOXD_TEST_PG=skip`).
    fn create() -> Option<Db> {
        let admin = match std::env::var("SANDBOXD_TEST_PG_URL") {
            Ok(u) if !u.is_empty() => u,
            _ if std::env::var("SANDBOXD_TEST_PG").as_deref() == Ok("skip") => {
                eprintln!("SKIPPED: the replica tests need Postgres (SANDBOXD_TEST_PG=skip)");
                return None;
            }
            _ => panic!(
                "SANDBOXD_TEST_PG_URL is not set: the replica tests need a real cluster. Run them \
                 under `bash scripts/pg-test.sh -- cargo test …`, or set SANDBOXD_TEST_PG=skip \
                 to skip them knowingly"
            ),
        };
        let name = format!("sbx_replicas_{}", uuid::Uuid::new_v4().simple());
        psql(&admin, &format!("CREATE DATABASE \"{name}\""));
        let mut url = url::Url::parse(&admin).expect("SANDBOXD_TEST_PG_URL is a URL");
        url.set_path(&format!("/{name}"));
        Some(Db {
            admin,
            name,
            url: url.to_string(),
        })
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        let _ = Command::new("psql")
            .args([self.admin.as_str(), "-qc", drop.as_str()])
            .output();
    }
}

fn psql(url: &str, statement: &str) {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", statement])
        .output()
        .expect("psql (apt-get install postgresql-client-15)");
    assert!(
        out.status.success(),
        "psql {statement}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Replicas of one service: one store, one engine, a data directory each. The first
/// environment's users are the test's (its drop removes their containers).
pub(crate) struct Cluster {
    /// Dropped first (fields drop in order): a replica still running when its environment
    /// cleans up could refill its warm pool after the cleanup.
    serves: Vec<Option<Serve>>,
    envs: Vec<Env>,
    /// Dropped last: the replicas hold connections to it.
    _db: Db,
}

/// How long a replica's lease lasts in these tests.
const LEASE_SECS: u64 = 2;

impl Cluster {
    pub(crate) async fn start(n: usize, llm: &FakeLlm, extra: &str) -> Option<Cluster> {
        Self::start_with(n, llm, "", extra).await
    }

    /// `start`, with `sessions` (keys of `[sessions]`: `Env::new` writes its extra text right
    /// under that table) at the head of the config.
    async fn start_with(n: usize, llm: &FakeLlm, sessions: &str, extra: &str) -> Option<Cluster> {
        Self::start_leased(n, llm, sessions, LEASE_SECS, extra).await
    }

    /// `start_with`, the replicas' leases lasting `lease_secs` (a test that stops a replica
    /// for a while without its runs being taken over).
    pub(crate) async fn start_leased(
        n: usize,
        llm: &FakeLlm,
        sessions: &str,
        lease_secs: u64,
        extra: &str,
    ) -> Option<Cluster> {
        let db = Db::create()?;
        let config = format!(
            "{sessions}{}[store]\nurl = {:?}\n[server]\nlease_secs = {lease_secs}\ndrain_secs = 2\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\n{extra}",
            llm_config(llm),
            db.url
        );
        let mut envs = Vec::new();
        for _ in 0..n {
            envs.push(Env::new(&config).await);
        }
        let serves = envs.iter().map(|e| Some(e.start())).collect();
        Some(Cluster {
            envs,
            serves,
            _db: db,
        })
    }

    /// `sandboxd users add` (through the first replica's config: the shared store).
    pub(crate) fn add_user(&self, name: &str, args: &[&str]) -> String {
        self.envs[0].add_user(name, args)
    }

    /// The ids of the users `add_user` made.
    pub(crate) fn serve(&self, i: usize) -> &Serve {
        self.serves[i].as_ref().expect("replica running")
    }

    pub(crate) fn api(&self, i: usize, key: &str) -> Api {
        Api::new(self.serve(i), key)
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut s) = self.serves[i].take() {
            s.kill9();
        }
    }

    fn restart(&mut self, i: usize) {
        assert!(self.serves[i].is_none(), "replica {i} is still running");
        self.serves[i] = Some(self.envs[i].start());
    }

    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.serves.iter().enumerate() {
            if let Some(s) = s {
                out.push_str(&format!("--- replica {i}\n{}\n", s.log.lock().unwrap()));
            }
        }
        out
    }
}

async fn create_session(api: &Api) -> String {
    api.session().await
}

#[tokio::test(flavor = "multi_thread")]
async fn any_replica_answers_any_request() {
    let llm = FakeLlm::start(vec![]).await;
    let Some(c) = Cluster::start(3, &llm, "").await else {
        return;
    };
    let root = c.add_user("root", &["--admin"]);
    // A user made through replica 1 signs in on replica 3.
    let (s, made) = c
        .api(0, &root)
        .json(Method::POST, "/v1/users", Some(json!({"name": "carol"})))
        .await;
    assert_eq!(s, 201, "{made}");
    let carol = made["key"].as_str().unwrap().to_string();
    c.envs[0].track_user(made["user"]["id"].as_str().unwrap());
    let (s, me) = c.api(2, &carol).json(Method::GET, "/v1/me", None).await;
    assert_eq!((s, me["name"].as_str()), (200, Some("carol")), "{me}");

    // A session made on 1 runs a command through 2 and takes a file through 3; its
    // environment reaches its processes on 2 as on 1.
    let id = c
        .api(0, &carol)
        .session_with(json!({"env": {"GREETING": "hi 'there'"}}))
        .await;
    let out = c.api(1, &carol).exec(&id, "printf %s \"$GREETING\"").await;
    assert_eq!(out["stdout"], "hi 'there'", "{out}");
    let out = c
        .api(1, &carol)
        .exec(
            &id,
            "echo made-on-one > /workspace/a.txt && cat /workspace/a.txt",
        )
        .await;
    assert_eq!(
        out["stdout"].as_str().map(str::trim),
        Some("made-on-one"),
        "{out}"
    );
    let put = c
        .api(2, &carol)
        .req(
            Method::PUT,
            &format!("/v1/sessions/{id}/files/content?path=b.bin"),
        )
        .body(vec![0u8, 1, 2, 255])
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "upload on 3: {}", put.status());
    let got = c
        .api(0, &carol)
        .req(
            Method::GET,
            &format!("/v1/sessions/{id}/files/content?path=b.bin"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(got.status().as_u16(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), &[0u8, 1, 2, 255]);
    let out = c.api(2, &carol).exec(&id, "cat /workspace/a.txt").await;
    assert_eq!(out["stdout"].as_str().map(str::trim), Some("made-on-one"));

    // Another user gets a 404 for it on every replica; its owner ends it on 2, and every
    // replica then answers that it ended.
    let bob = c.add_user("bob", &[]);
    for i in 0..3 {
        let (s, v) = c
            .api(i, &bob)
            .json(Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!((s, code(&v)), (404, "not_found"), "replica {i}: {v}");
    }
    let (s, v) = c
        .api(1, &carol)
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert!(s == 200 || s == 204, "delete on 2: {s} {v}");
    for i in 0..3 {
        let (s, v) = c
            .api(i, &carol)
            .json(Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(
            (s, v["state"].as_str()),
            (200, Some("ended")),
            "replica {i}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_posted_on_one_replica_is_followed_on_the_others_exactly_once() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "echo step-one"})).gated(&gate),
        Reply::tool("bash", json!({"command": "echo step-two"})),
        Reply::tool("bash", json!({"command": "echo step-three"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let Some(c) = Cluster::start(3, &llm, "").await else {
        return;
    };
    let alice = c.add_user("alice", &[]);
    let run = start_run(
        &c.api(1, &alice),
        json!({"task": "three steps", "session": {}}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    // Followers on 1 and 3 connect while the run waits on the LLM, so they see it live; a
    // third on 1 leaves after 3 events.
    let (a1, a3) = (c.api(0, &alice), c.api(2, &alice));
    let early = events(&a1, &id, "", None).await;
    let f1 = tokio::spawn(read_sse(events(&a1, &id, "", None).await, None));
    let f3 = tokio::spawn(read_sse(events(&a3, &id, "", None).await, None));
    let partial = tokio::spawn(read_sse(early, Some(3)));
    gate.open();
    let (f1, f3, partial) = (f1.await.unwrap(), f3.await.unwrap(), partial.await.unwrap());
    assert_numbered(&f1, 1);
    assert_eq!(f1, f3, "followers on two replicas see the same events");
    assert_eq!(
        f1.last().map(|e| e.data["state"].clone()),
        Some(json!("succeeded")),
        "{:?}",
        kinds(&f1)
    );
    let results: Vec<&Sse> = f1.iter().filter(|e| e.event == "tool_result").collect();
    assert_eq!(
        results.len(),
        4,
        "three bash steps and terminate: {:?}",
        kinds(&f1)
    );
    // The one that left resumes on replica 3 with Last-Event-ID and misses nothing.
    assert_eq!(partial, f1[..3].to_vec());
    let resumed = read_sse(events(&a3, &id, "", Some(3)).await, None).await;
    assert_eq!(
        resumed,
        f1[3..].to_vec(),
        "Last-Event-ID 3 on another replica"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_runs_posted_to_one_session_on_two_replicas_run_one_after_the_other() {
    let finish = || Reply::tool("terminate", json!({"status": "success", "answer": "ok"}));
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "sleep 1; echo a"})),
        finish(),
        Reply::tool("bash", json!({"command": "sleep 1; echo b"})),
        finish(),
    ])
    .await;
    let Some(c) = Cluster::start(2, &llm, "").await else {
        return;
    };
    let alice = c.add_user("alice", &[]);
    let (a0, a1) = (c.api(0, &alice), c.api(1, &alice));
    let session = create_session(&a0).await;
    let body = json!({"task": "one of two", "session_id": session});
    let (r0, r1) = tokio::join!(start_run(&a0, body.clone()), start_run(&a1, body.clone()));
    let (id0, id1) = (r0["id"].as_str().unwrap(), r1["id"].as_str().unwrap());
    let (e0, e1) = tokio::join!(follow_all(&a1, id0), follow_all(&a0, id1));
    for e in [&e0, &e1] {
        assert_eq!(
            e.last().unwrap().data["state"],
            "succeeded",
            "{:?}",
            kinds(e)
        );
    }
    let (g0, g1) = (get_run(&a0, id0).await, get_run(&a1, id1).await);
    let t = |v: &Value, k: &str| {
        chrono::DateTime::parse_from_rfc3339(v[k].as_str().unwrap_or_else(|| panic!("{k}: {v}")))
            .unwrap()
    };
    let (first, second) = if t(&g0, "started_at") <= t(&g1, "started_at") {
        (&g0, &g1)
    } else {
        (&g1, &g0)
    };
    assert!(
        t(second, "started_at") >= t(first, "ended_at"),
        "the later run started before the earlier ended: {first} / {second}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_creates_over_three_replicas_against_a_cap_of_five() {
    let llm = FakeLlm::start(vec![]).await;
    let Some(c) = Cluster::start(3, &llm, "[quotas]\nsessions = 5\n").await else {
        return;
    };
    let alice = c.add_user("alice", &[]);
    let apis: Vec<Api> = (0..3).map(|i| c.api(i, &alice)).collect();
    let creates = (0..30).map(|i| {
        let api = apis[i % 3].clone();
        async move {
            api.json(Method::POST, "/v1/sessions", Some(json!({})))
                .await
        }
    });
    let answers = futures::future::join_all(creates).await;
    let made: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(made.len(), 5, "exactly the cap: {answers:?}");
    for (s, v) in &answers {
        assert!(
            *s == 201 || (*s == 429 && code(v) == "quota_exceeded"),
            "every other create is refused by the quota: {s} {v}"
        );
    }
    let (s, list) = apis[1].json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(s, 200);
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(5), "{list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_run_loses_nothing_committed() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "echo before-the-kill > /workspace/k.txt"}),
        ),
        // The run waits here, on replica 2, when it is killed.
        Reply::tool("bash", json!({"command": "echo never"})).gated(&gate),
        Reply::tool("terminate", json!({"status": "success", "answer": "after"})),
    ])
    .await;
    let Some(mut c) = Cluster::start(3, &llm, "").await else {
        return;
    };
    let alice = c.add_user("alice", &[]);
    let a0 = c.api(0, &alice);
    let session = create_session(&a0).await;
    let run = start_run(
        &c.api(1, &alice),
        json!({"task": "cut off", "session_id": session}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    // Wait until the first command's result is committed: the second LLM call is in flight.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let evs = read_sse(events(&a0, &id, "?follow=false", None).await, None).await;
        if evs.iter().any(|e| e.event == "tool_result") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first step never committed: {}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.kill9(1);
    let killed = Instant::now();
    // What was committed when it died: the replica may have appended more (a `thinking`)
    // after the read above, and nothing after the kill.
    let before = read_sse(events(&a0, &id, "?follow=false", None).await, None).await;

    // Another replica marks it interrupted once the lease is out, after its kept events.
    let bound = Duration::from_secs(30 * LEASE_SECS);
    let state = loop {
        let v = get_run(&a0, &id).await;
        if v["state"] != "running" && v["state"] != "queued" {
            break v;
        }
        assert!(
            killed.elapsed() < bound,
            "still {v} after {bound:?}: {}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "interrupted {:?} after the kill (lease {LEASE_SECS} s)",
        killed.elapsed()
    );
    assert_eq!(state["state"], "interrupted", "{state}");
    let all = follow_all(&c.api(2, &alice), &id).await;
    assert_numbered(&all, 1);
    assert_eq!(
        all[..before.len()],
        before[..],
        "the committed events are intact"
    );
    let tail = kinds(&all[before.len()..]);
    assert_eq!(tail, ["run_finished", "run_state"], "{tail:?}");
    assert_eq!(all.last().unwrap().data["state"], "interrupted");

    // The session goes on: a new run in it, posted on 3, ends well and sees the file.
    gate.open();
    let next = start_run(
        &c.api(2, &alice),
        json!({"task": "go on", "session_id": session}),
    )
    .await;
    let next_id = next["id"].as_str().unwrap().to_string();
    let evs = follow_all(&a0, &next_id).await;
    assert_eq!(
        evs.last().unwrap().data["state"],
        "succeeded",
        "{:?}",
        kinds(&evs)
    );
    let out = a0.exec(&session, "cat /workspace/k.txt").await;
    assert_eq!(
        out["stdout"].as_str().map(str::trim),
        Some("before-the-kill")
    );

    // The dead replica, restarted, takes no run back and removes no live container.
    c.restart(1);
    let a1 = c.api(1, &alice);
    let out = a1.exec(&session, "cat /workspace/k.txt").await;
    assert_eq!(
        out["stdout"].as_str().map(str::trim),
        Some("before-the-kill")
    );
    assert_eq!(get_run(&a1, &id).await["state"], "interrupted");
    assert_eq!(get_run(&a1, &next_id).await["state"], "succeeded");
    let (s, v) = a1
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
}

/// Hibernates session `id` through the admin route of replica `i`.
async fn hibernate_on(c: &Cluster, i: usize, admin: &str, id: &str) {
    let (s, v) = c
        .api(i, admin)
        .json(Method::POST, &format!("/v1/sessions/{id}/hibernate"), None)
        .await;
    assert_eq!(s, 200, "hibernate on replica {i}: {v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_hibernated_on_one_replica_resumes_on_another_through_a_shared_snapshot_dir() {
    let llm = FakeLlm::start(vec![]).await;
    let shared = tempfile::tempdir().unwrap();
    let sessions = format!("snapshot_dir = {:?}\n", shared.path());
    let Some(c) = Cluster::start_with(2, &llm, &sessions, "").await else {
        return;
    };
    let root = c.add_user("root", &["--admin"]);
    let ann = c.add_user("ann", &[]);
    let id = c.api(0, &ann).session().await;
    c.api(0, &ann)
        .exec(&id, "echo kept > /workspace/k.txt")
        .await;
    hibernate_on(&c, 0, &root, &id).await;
    let out = c.api(1, &ann).exec(&id, "cat /workspace/k.txt").await;
    assert_eq!(out["stdout"], "kept\n", "{out}");
    assert!(
        out["note"].as_str().unwrap_or("").contains("resumed"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_cannot_see_a_snapshot_answers_503_and_keeps_the_session() {
    let llm = FakeLlm::start(vec![]).await;
    // Each replica's snapshots in its own data directory: nothing shared.
    let Some(c) = Cluster::start(2, &llm, "").await else {
        return;
    };
    let root = c.add_user("root", &["--admin"]);
    let ann = c.add_user("ann", &[]);
    let id = c.api(0, &ann).session().await;
    c.api(0, &ann)
        .exec(&id, "echo kept > /workspace/k.txt")
        .await;
    hibernate_on(&c, 0, &root, &id).await;
    let (s, v) = c
        .api(1, &ann)
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec"),
            Some(json!({"command": "cat /workspace/k.txt"})),
        )
        .await;
    assert_eq!((s, code(&v)), (503, "sandbox_unavailable"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("snapshot_dir") && msg.contains("kept"),
        "{msg}"
    );
    let (_, view) = c
        .api(1, &ann)
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(view["state"], "hibernated", "{view}");
    // The replica that saved it resumes it, files and all.
    let out = c.api(0, &ann).exec(&id, "cat /workspace/k.txt").await;
    assert_eq!(out["stdout"], "kept\n", "{out}");
}
