//! MCP both ways.
//!
//! * `server`/`http`: sandboxd as an MCP server. The agent's own tool registry
//!   (`server::session_registry`) is served over stdio (`serve_stdio`) or streamable HTTP
//!   (`http::HttpServer`), one sandbox container per client session; stateless clients use
//!   explicit sandbox ids (see the header of server.rs).
//! * `client`: external MCP servers from config/mcp.json as agent tools
//!   (`connect_all`, `McpClients::register_into`, `refresh`, `system_messages`).
//! * `admission`: what the front end decides around each sandbox (serve: the user's quota).
//! * `names`: the sanitizing of remote tool names; `config`: the mcp.json format.
//! * `bench`: the tools/call round-trip benchmark for `sandboxd bench`.

pub mod admission;
pub mod client;
pub mod config;
mod in_sandbox;
pub mod lazy;
pub mod names;
mod remote;
mod remote_tool;
pub mod server;
mod sse_legacy;
pub mod stateless;
mod wire;

use std::sync::Arc;

pub use client::{McpClients, McpTool, ToolsChange, connect_all, connect_all_in};
pub use server::{SandboxServer, ServerState, session_registry};

/// Serves the tools over stdin/stdout until the client closes stdin, then removes the
/// connection's container.
pub async fn serve_stdio(
    state: Arc<ServerState>,
) -> Result<(), rmcp::service::ServerInitializeError> {
    use rmcp::ServiceExt;
    let server = SandboxServer::new(state.clone());
    let slot = server.slot().clone();
    let running = server.serve(rmcp::transport::stdio()).await?;
    let quit = running.waiting().await;
    if let Err(e) = quit {
        tracing::warn!(error = %e, "the MCP stdio service ended abnormally");
    }
    slot.sandbox.close().await;
    drop(slot);
    state.shutdown().await;
    Ok(())
}
