//! The wire shapes of both dialects, and hostile answers.

use super::*;

fn base() -> Url {
    Url::parse("https://agent.example/.well-known/agent-card.json").unwrap()
}

#[test]
fn a_v1_card_prefers_its_v1_jsonrpc_interface() {
    let card = json!({
        "name": "w", "description": "Weather\u{1b}[31m",
        "supportedInterfaces": [
            {"url": "https://agent.example/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "/rpc03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        ],
    });
    let c = parse_card(card.to_string().as_bytes(), &base()).unwrap();
    assert_eq!(c.endpoint.as_str(), "https://agent.example/rpc");
    assert_eq!(c.dialect, Dialect::V1);
    assert_eq!(c.description, "Weather[31m");
}

#[test]
fn a_03_card_uses_its_url() {
    let card =
        json!({"name": "old", "url": "https://agent.example/a2a", "protocolVersion": "0.3.0"});
    let c = parse_card(card.to_string().as_bytes(), &base()).unwrap();
    assert_eq!(c.dialect, Dialect::V03);
    assert_eq!(c.endpoint.as_str(), "https://agent.example/a2a");
}

#[test]
fn cards_without_a_usable_endpoint_are_refused_saying_why() {
    for card in [
        json!({"name": "x"}),
        json!({"url": "https://a.example/x", "preferredTransport": "GRPC"}),
        json!({"url": "file:///etc/passwd"}),
    ] {
        assert!(
            parse_card(card.to_string().as_bytes(), &base()).is_err(),
            "{card}"
        );
    }
    let err = parse_card(b"<html>", &base()).unwrap_err();
    assert!(err.contains("not JSON"), "{err}");
}

#[test]
fn send_requests_speak_each_dialect() {
    let v1 = send(Dialect::V1, 7, "hi", Some("ctx"), None);
    assert_eq!(v1["method"], "SendMessage");
    assert_eq!(v1["params"]["message"]["role"], "ROLE_USER");
    assert_eq!(v1["params"]["message"]["parts"][0]["text"], "hi");
    assert_eq!(v1["params"]["message"]["contextId"], "ctx");
    assert_eq!(v1["params"]["configuration"]["returnImmediately"], true);
    let old = send(Dialect::V03, 8, "hi", None, Some("t1"));
    assert_eq!(old["method"], "message/send");
    assert_eq!(old["params"]["message"]["parts"][0]["kind"], "text");
    assert_eq!(old["params"]["message"]["taskId"], "t1");
    assert_eq!(old["params"]["configuration"]["blocking"], false);
    assert_eq!(get(Dialect::V03, 1, "t")["method"], "tasks/get");
    assert_eq!(cancel(Dialect::V1, 1, "t")["method"], "CancelTask");
}

#[test]
fn v1_and_03_tasks_read_the_same() {
    let v1 = json!({"jsonrpc": "2.0", "id": 1, "result": {"task": {
        "id": "t", "contextId": "c",
        "status": {"state": "TASK_STATE_COMPLETED"},
        "artifacts": [{"parts": [{"text": "done"}, {"url": "https://x/f.csv", "filename": "f.csv"}]}],
    }}});
    let old = json!({"jsonrpc": "2.0", "id": 1, "result": {
        "kind": "task", "id": "t", "contextId": "c",
        "status": {"state": "completed"},
        "artifacts": [{"parts": [{"kind": "text", "text": "done"},
                                 {"kind": "file", "file": {"uri": "https://x/f.csv", "name": "f.csv"}}]}],
    }});
    let a = parse_reply(v1.to_string().as_bytes()).unwrap();
    let b = parse_reply(old.to_string().as_bytes()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.state, State::Completed);
    assert_eq!(a.artifacts, "done\n[file f.csv: https://x/f.csv]");
}

#[test]
fn a_question_is_input_required_with_its_text() {
    let v = json!({"result": {"task": {"id": "t", "contextId": "c", "status": {
        "state": "TASK_STATE_INPUT_REQUIRED",
        "message": {"role": "ROLE_AGENT", "parts": [{"text": "Which city?"}]}}}}});
    let r = parse_reply(v.to_string().as_bytes()).unwrap();
    assert_eq!(r.state, State::InputRequired);
    assert!(r.state.settled());
    assert_eq!(r.status, "Which city?");
}

#[test]
fn errors_and_hostile_answers_are_errors_or_cut() {
    let e = json!({"error": {"code": -32001, "message": "Task not found"}});
    let err = parse_reply(e.to_string().as_bytes()).unwrap_err();
    assert!(
        err.contains("-32001") && err.contains("Task not found"),
        "{err}"
    );
    let odd = json!({"result": {"task": {"id": "t", "status": {"state": "EXPLODED"}}}});
    assert!(parse_reply(odd.to_string().as_bytes()).is_err());
    assert!(parse_reply(b"{}").is_err());
    let huge = "x".repeat(MAX_TEXT * 3);
    let big = json!({"result": {"task": {"id": "t", "status": {"state": "completed"},
        "artifacts": [{"parts": [{"text": huge}]}]}}});
    let r = parse_reply(big.to_string().as_bytes()).unwrap();
    assert!(r.artifacts.len() < MAX_TEXT + 100, "{}", r.artifacts.len());
    assert!(r.artifacts.ends_with("bytes in all]"));
}

#[test]
fn a_direct_message_ends_the_exchange() {
    let v = json!({"result": {"message": {"contextId": "c", "parts": [{"text": "hello"}]}}});
    let r = parse_reply(v.to_string().as_bytes()).unwrap();
    assert_eq!(
        (r.task, r.state, r.status.as_str()),
        (None, State::Completed, "hello")
    );
}
