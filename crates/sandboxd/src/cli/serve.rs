//! `sandboxd serve`: the multi-user service (API, /mcp, health) on one listener.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use sandboxd_core::sandbox::SessionManager;
use sandboxd_server::{Server, openapi};

use super::Ctx;

#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on (default [server] listen, 127.0.0.1:8080). A non-loopback
    /// address is refused until a user exists.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Print the OpenAPI document and exit (this is how docs/openapi.json is made).
    #[arg(long)]
    pub openapi: bool,
}

pub(crate) async fn main(ctx: Ctx, args: ServeArgs) -> anyhow::Result<ExitCode> {
    if args.openapi {
        use std::io::Write as _;
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = std::io::stdout().write_all(openapi::document_json().as_bytes());
        return Ok(ExitCode::SUCCESS);
    }
    raise_open_file_limit();
    let addr = match args.listen {
        Some(a) => a,
        None => ctx.config.server.listen.parse().with_context(|| {
            format!(
                "[server] listen = {:?} is not an address like 127.0.0.1:8080",
                ctx.config.server.listen
            )
        })?,
    };
    let store = crate::backends::store(&ctx.config).await?;
    let users = store.user_count().await?;
    let runtime = ctx
        .runtime()
        .await
        .context("cannot prepare the sandbox runtime")?;
    // The pool is scoped to the service (its store): API sessions are kept across restarts
    // and attached by any replica, and the store's records say which warm sandboxes they
    // claimed (see crates/server/src/lib.rs).
    let scope = sandboxd_server::pool_owner_for(&ctx.config)?;
    let manager = SessionManager::with_scoped_pool(
        runtime,
        ctx.config.limits.clone(),
        ctx.config.sessions.clone(),
        crate::backends::pool(&ctx.config),
        scope,
        crate::backends::store_records(&store),
    );
    manager.set_templates(crate::backends::templates(&ctx.config)?);
    // Before the reconcile, which ends what has no sandbox (and its records with it).
    super::serve_records::adopt_files_logged(&ctx.config.data_dir(), &store, &manager).await;
    let server = Server::start(ctx.config.clone(), store, manager, addr).await?;
    let r = &server.reconciled;
    eprintln!(
        "sandboxd serve: listening on http://{} (API /v1, MCP /mcp); store {}; {} session(s) re-attached, {} ended, {} stray container(s) removed",
        server.addr,
        crate::backends::store_location(&ctx.config),
        r.reattached.len(),
        r.ended.len(),
        r.removed_containers.len()
    );
    if users == 0 {
        eprintln!(
            "sandboxd serve: no users yet, so every request is refused; create one with `sandboxd users add NAME --admin`"
        );
    }
    server
        .serve(super::mcp::shutdown_signal())
        .await
        .context("the server failed")?;
    eprintln!("sandboxd serve: stopped; API sessions are kept for the next start");
    Ok(ExitCode::SUCCESS)
}

/// Raises the soft open-file limit to the hard one (systemd's default soft limit is 1024):
/// client connections, Docker API streams and the store all take descriptors, and the
/// connection cap is set from this limit. A failure is logged, not fatal: the cap then fits
/// the lower limit.
pub(crate) fn raise_open_file_limit() {
    use sandboxd_server::listen::nofile;
    match nofile::raise_soft_to_hard() {
        Ok((before, after)) if before != after => tracing::info!(
            before = ?before,
            after = ?after,
            "raised the open-file limit (soft) to the hard limit"
        ),
        Ok((now, _)) => {
            tracing::info!(limit = ?now, "the open-file limit is already at its hard limit")
        }
        Err(e) => tracing::warn!("{e}"),
    }
}
