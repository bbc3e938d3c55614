//! The agent card (`GET /.well-known/agent-card.json`, public, and `GetExtendedAgentCard`,
//! authenticated): what sandboxd offers over A2A. One skill per run mode (the agent, the
//! planning flow; a message picks one with `metadata.mode`), streaming, no push
//! notifications, and the security scheme: a sandboxd API key as an HTTP bearer token.
//! Interfaces are listed for v1.0 and for 0.3 at the same URL (the `A2A-Version` header
//! tells them apart), and the 0.3 top-level `url`/`protocolVersion` fields are kept for 0.3
//! clients, which v1.0 readers ignore.

use axum::http::HeaderMap;
use serde_json::{Value, json};

/// Where the JSON-RPC endpoint is.
pub const PATH: &str = "/a2a";
pub const WELL_KNOWN: &str = "/.well-known/agent-card.json";

/// The base URL the client reached this server at (its Host header). sandboxd serves plain
/// HTTP; behind a TLS proxy, the proxy's `X-Forwarded-Proto: https` names the scheme.
pub fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or("localhost");
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    format!("{}://{host}", if https { "https" } else { "http" })
}

fn skill(id: &str, name: &str, description: &str, tags: &[&str], example: &str) -> Value {
    json!({
        "id": id,
        "name": name,
        "description": description,
        "tags": tags,
        "examples": [example],
        "inputModes": ["text/plain"],
        "outputModes": ["text/plain", "application/octet-stream"],
    })
}

/// The card, with the endpoint at `base`.
pub fn card(base: &str) -> Value {
    let url = format!("{base}{PATH}");
    json!({
        "name": "sandboxd",
        "description": "A general-purpose agent that works in a private, isolated sandbox (a container with Python, a shell, a browser and files in /workspace). A task is one run; a context is one sandbox session, so later messages in the same context continue its conversation and see its files.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "capabilities": {"streaming": true, "pushNotifications": false, "extendedAgentCard": true},
        "securitySchemes": {
            "sandboxd_api_key": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "bearerFormat": "sandboxd API key",
                "description": "A sandboxd API key (`sandboxd users add`), as `Authorization: Bearer <key>`",
            }},
        },
        "securityRequirements": [{"schemes": {"sandboxd_api_key": {"list": []}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/octet-stream"],
        "skills": [
            skill("agent", "Agent run",
                "Does the task with tools in the sandbox (Python, shell, browser, files, web research) and answers; the files it leaves in /workspace are artifacts. It may ask you a question (input-required): your next message in the task answers it.",
                &["code", "browser", "research", "files"],
                "Plot sin(x) for x in [0, 2pi] and save it as /workspace/sin.png"),
            skill("plan", "Planning flow",
                "Plans the task in steps and runs each step as an agent run (send metadata {\"mode\": \"plan\"} with the message).",
                &["planning", "multi-step"],
                "Research three Rust HTTP servers and write a comparison to /workspace/report.md"),
        ],
        // 0.3 readers take these; v1.0 readers take supportedInterfaces.
        "url": url,
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
    })
}
