//! serve's side of a session's egress proxy, in-process (harness.rs): the `EgressAudit` it
//! gives the proxy stores each record (counters and the recent list of GET
//! /v1/sessions/{id}/egress), makes it an `egress` event of the session's run in flight and
//! part of the run's summary; the `PolicySource` reads the row, so a PUT is the next
//! connection's policy, and an ended session allows nothing.

use reqwest::Method;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::egress::{EgressAudit as _, EgressRecord, PolicySource as _};
use sandboxd_core::store::now_ms;
use sandboxd_server::egress::{StoreAudit, StorePolicy};
use sandboxd_testkit::fake_llm::{FakeLlm, Gate};
use serde_json::json;

use crate::harness::{Setup, code, start_on};
use crate::runs_in_process::{all_events, llm_asked, run, run_in_state, terminate};

fn record(
    session: &str,
    owner: &str,
    host: &str,
    allowed: bool,
    up: u64,
    down: u64,
) -> EgressRecord {
    EgressRecord {
        session: session.into(),
        owner: owner.into(),
        method: "CONNECT".into(),
        host: host.into(),
        port: 443,
        allowed,
        rule: if allowed {
            "*.example.org"
        } else {
            "not in the allowlist"
        }
        .into(),
        reason: (!allowed).then(|| format!("{host} is not in the allowlist")),
        bytes_up: up,
        bytes_down: down,
        started_ms: now_ms(),
        duration_ms: 5,
    }
}

#[tokio::test]
async fn a_record_is_stored_an_event_of_the_run_in_flight_and_in_the_runs_summary() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![terminate().gated(&gate)]).await;
    let (serve, keys) = start_on(&Setup::with_llm(&llm), &[("ann", None), ("bob", None)]).await;
    let (ann, bob) = (&keys[0], &keys[1]);
    let session = serve.session(ann).await;
    let (_, v) = serve
        .call(ann, Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    let owner = v["owner"].as_str().unwrap().to_string();
    let (id, _) = run(&serve, ann, &session).await;
    llm_asked(&llm, 1).await;

    let audit = StoreAudit {
        store: serve.state.store.clone(),
        runs: serve.state.runs.clone(),
    };
    audit
        .record(record(&session, &owner, "api.example.org", true, 120, 3400))
        .await;
    audit
        .record(record(&session, &owner, "evil.test", false, 0, 0))
        .await;
    gate.open();
    run_in_state(&serve, ann, &id, "succeeded").await;

    let evs = all_events(&serve, ann, &id).await;
    let egress: Vec<_> = evs.iter().filter(|e| e.2["type"] == "egress").collect();
    assert_eq!(egress.len(), 2, "{evs:?}");
    assert_eq!(egress[0].2["record"]["host"], "api.example.org");
    assert_eq!(egress[0].2["record"]["bytes_down"], 3400);
    assert_eq!(egress[1].2["record"]["allowed"], false);
    assert_eq!(egress[1].2["record"]["rule"], "not in the allowlist");

    let (s, v) = serve
        .call(ann, Method::GET, &format!("/v1/runs/{id}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["egress"]["counters"],
        json!({"connections": 1, "refused": 1, "bytes_up": 120, "bytes_down": 3400})
    );
    assert_eq!(v["egress"]["hosts"][0]["host"], "api.example.org");
    assert_eq!(v["egress"]["hosts"][1]["refused"], 1);

    let path = format!("/v1/sessions/{session}/egress");
    let (s, v) = serve.call(ann, Method::GET, &path, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["counters"]["connections"], 1);
    assert_eq!(v["recent"][0]["host"], "evil.test");
    let (s, v) = serve.call(bob, Method::GET, &path, None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // A record of a session the store does not know is dropped, with no event anywhere.
    audit
        .record(record("ses_nope", &owner, "x.example.org", true, 1, 1))
        .await;
}

#[tokio::test]
async fn the_policy_source_reads_the_row_at_every_call() {
    let (serve, keys) = start_on(&Setup::new(), &[("ann", None)]).await;
    let key = &keys[0];
    let session = serve.session(key).await;
    let source = StorePolicy {
        store: serve.state.store.clone(),
        session: session.clone(),
    };
    assert_eq!(source.policy().await.unwrap(), EgressPolicy::Off);
    let path = format!("/v1/sessions/{session}/egress");
    let (s, v) = serve
        .call(
            key,
            Method::PUT,
            &path,
            Some(json!({"egress": "a.example.org"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(source.policy().await.unwrap().to_string(), "a.example.org");
    let (s, _) = serve
        .call(
            key,
            Method::DELETE,
            &format!("/v1/sessions/{session}"),
            None,
        )
        .await;
    assert_eq!(s, 204);
    assert_eq!(
        source.policy().await.unwrap(),
        EgressPolicy::Off,
        "an ended session allows nothing"
    );
    let gone = StorePolicy {
        store: serve.state.store.clone(),
        session: "ses_nope".into(),
    };
    assert_eq!(gone.policy().await.unwrap(), EgressPolicy::Off);
}
