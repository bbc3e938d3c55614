//! `sandboxd bench stream`: the time from a streaming model's first piece of text to the
//! web UI's event stream (`delta` over GET /v1/runs/{id}/events of a real server) and to the
//! run page's live box in the host's chromium (beside a plain SSE client of the same run),
//! one condensation of a long history, and counting one observation's tokens.

use std::sync::Arc;

use sandboxd_core::sandbox::SessionManager;

use super::Ctx;
use super::bench::{bench_session, row, section};

pub(crate) async fn stream(
    manager: Arc<SessionManager>,
    ctx: &Ctx,
    n: usize,
) -> anyhow::Result<()> {
    use sandboxd::bench::stream as bench;
    section("Streaming and context");
    match bench::bench_first_token(manager.clone(), ctx.config.clone(), n).await {
        Ok(mut samples) => row(
            "first token: model sends its first text piece → SSE client has the `delta`",
            &mut samples,
            "",
            &mut [],
            "≤ 50 ms",
        ),
        Err(e) => println!("| first token | not measured: {e} | | | | | ≤ 50 ms |"),
    }
    // The page's row needs the host's chromium (SANDBOXD_CHROMIUM, else Debian's).
    let chromium =
        std::env::var("SANDBOXD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let page = sandboxd::bench::ui_stream::bench_first_token_ui(
        manager.clone(),
        ctx.config.clone(),
        &chromium,
        n.min(20),
    );
    match page.await {
        Ok(mut b) => row(
            "first visible token: model sends its first text piece → the run page's live box has it (headless chromium)",
            &mut b.page,
            "SSE client of the same run",
            &mut b.sse,
            "≤ 50 ms",
        ),
        Err(e) => {
            println!("| first visible token in the page | not measured: {e} | | | | | ≤ 50 ms |")
        }
    }
    let s = bench_session(&manager).await?;
    let condensed = bench::bench_condense(s.sandbox.clone(), n.min(50)).await;
    manager.remove(&s.owner, &s.id).await?;
    let (mut condense, mut count) = condensed?;
    row(
        "condensation: 40 steps (~90k tokens) under a 12k budget: mask into files + summary (model answers at once)",
        &mut condense,
        "",
        &mut [],
        "recorded",
    );
    row(
        "token count of one 10,000-character observation (cl100k)",
        &mut count,
        "",
        &mut [],
        "per-step overhead within 2 ms p50 (see `bench agent`)",
    );
    println!();
    Ok(())
}
