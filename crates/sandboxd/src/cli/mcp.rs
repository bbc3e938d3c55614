//! `sandboxd mcp`: serve the sandbox tools over MCP, on stdio or (with --listen) over
//! streamable HTTP at /mcp behind a bearer token.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use sandboxd_core::mcp::{ServerState, serve_stdio};
use sandboxd_core::sandbox::Owner;
use sandboxd_server::mcp_http::{HttpServer, resolve_token};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub(crate) struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8765).
    /// The bearer token is [mcp] token or SANDBOXD_MCP_TOKEN; on a loopback address
    /// without one, a random token is generated and printed on stderr.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

pub(crate) async fn main(ctx: Ctx, args: McpArgs) -> anyhow::Result<ExitCode> {
    // Check the address and token before touching Docker, so a refusal is immediate.
    let token = match args.listen {
        Some(addr) => Some(resolve_token(addr, &ctx.config.mcp.token)?),
        None => None,
    };
    // `manager()` reconciles first: orphans of dead processes go, sessions of live ones stay.
    let manager = ctx.manager().await?;
    match (args.listen, token) {
        (Some(addr), Some((token, generated))) => {
            super::serve::raise_open_file_limit();
            let state = ServerState::new(manager, ctx.config.clone(), Owner::new("mcp-http")?);
            let server = HttpServer::bind(addr, token.clone()).await?;
            eprintln!("sandboxd mcp: listening on http://{}/mcp", server.addr);
            if generated {
                eprintln!(
                    "sandboxd mcp: no token configured; clients must send  Authorization: Bearer {token}"
                );
            }
            let stop = CancellationToken::new();
            let on_signal = stop.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                on_signal.cancel();
            });
            server
                .serve(state, stop)
                .await
                .context("the MCP HTTP server failed")?;
        }
        _ => {
            let state = ServerState::new(
                manager.clone(),
                ctx.config.clone(),
                Owner::new("mcp-stdio")?,
            );
            // An idle stdio client's container goes after [sessions] idle_timeout_secs; its
            // next call gets a fresh one.
            let _reaper = manager.spawn_reaper();
            // One that ends outside sandboxd (`docker rm -f`, an OOM kill, an evicted pod)
            // ends its session at once, so the client's next call says why (core's
            // mcp/lazy.rs). Stopped when this returns.
            let _vanish = AbortOnDropHandle::new(manager.spawn_vanish_watch());
            let _pool = manager.spawn_pool();
            tokio::select! {
                r = serve_stdio(state) => r.context("the MCP stdio server failed")?,
                _ = shutdown_signal() => manager.remove_all().await,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
