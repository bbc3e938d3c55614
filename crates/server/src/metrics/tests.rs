//! The registry's output: families and label values as README "Metrics" lists them, in both
//! formats, and every metric the Grafana dashboard queries exposed.

use std::time::Duration;

use super::*;

/// A registry with one of everything recorded.
fn exercised() -> Arc<Metrics> {
    let m = Metrics::new("docker", 2);
    m.session_created(Claim::Warm, Duration::from_millis(20));
    m.session_created(Claim::Cold, Duration::from_millis(900));
    m.session_created(Claim::Cold, Duration::from_millis(800));
    m.tool_call("bash", Duration::from_millis(5), false);
    m.llm_request(LlmCall {
        model: "m1",
        took: Duration::from_millis(50),
        ok: true,
        prompt_tokens: 10,
        completion_tokens: 3,
    });
    m.run_ended("succeeded");
    m.egress(false, 0, 0);
    m.egress(true, 100, 2000);
    m.http(
        "GET",
        "/v1/sessions/{id}".into(),
        404,
        Duration::from_millis(1),
    );
    m.exec(Duration::from_millis(3));
    m.store_call("user_by_key", Duration::from_millis(1));
    m
}

#[test]
fn each_family_renders_with_its_labels() {
    let m = exercised();
    let census = Census {
        live: 3,
        starting: 1,
        warm: 2,
        filling: 0,
    };
    let text = m.render(census, false).unwrap();
    for line in [
        "sandboxd_session_creates_total{claim=\"cold\"} 2",
        "sandboxd_session_creates_total{claim=\"warm\"} 1",
        "sandboxd_sessions{state=\"live\",backend=\"docker\"} 3",
        "sandboxd_pool_target 2",
        "sandboxd_tool_call_duration_seconds_count{tool=\"bash\",outcome=\"ok\"} 1",
        "sandboxd_llm_tokens_total{model=\"m1\",kind=\"prompt\"} 10",
        "sandboxd_llm_requests_total{model=\"m1\",outcome=\"ok\"} 1",
        "sandboxd_runs_ended_total{outcome=\"succeeded\"} 1",
        "sandboxd_egress_connections_total{decision=\"refused\"} 1",
        "sandboxd_egress_bytes_total{direction=\"down\"} 2000",
        "sandboxd_http_requests_total{method=\"GET\",route=\"/v1/sessions/{id}\",status=\"404\"} 1",
        "sandboxd_exec_duration_seconds_count 1",
        "sandboxd_store_operation_duration_seconds_count{op=\"user_by_key\"} 1",
        "# TYPE process_cpu_seconds_total counter",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    let open = m.render(census, true).unwrap();
    assert!(open.ends_with("# EOF\n"), "{open}");
}

/// Every metric the Grafana dashboard (deploy/grafana/sandboxd.json) queries is one this
/// registry exposes, so a renamed metric fails here rather than as an empty panel.
#[test]
fn the_dashboard_names_only_exposed_metrics() {
    let m = exercised();
    let text = m.render(Census::default(), false).unwrap();
    let exposed: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/sandboxd.json"
    );
    let dash = std::fs::read_to_string(path).unwrap();
    let mut queried = 0;
    for word in dash.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if !(word.starts_with("sandboxd_") || word.starts_with("process_")) {
            continue;
        }
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| word.strip_suffix(s))
            .unwrap_or(word);
        assert!(
            exposed.contains(family),
            "the dashboard queries {word}, which is not exposed"
        );
        queried += 1;
    }
    assert!(queried > 15, "the dashboard queries {queried} metrics");
}
