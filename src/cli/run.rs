//! `sandboxd run --prompt "..."`: the agent on one task in a fresh sandbox session.
//!
//! Order matters: the LLM configuration is checked before anything is created, so a
//! missing key costs nothing and says what to set. Then the session, the run (Ctrl-C
//! cancels it, killing the command in flight), the copy of /workspace to the host (through
//! the hostile-tar rules) and the removal of the container unless `--keep`.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use sandboxd::agent::{Agent, AgentSettings, FinishReason, RunRequest, new_run_id};
use sandboxd::llm::{LlmClient, LlmError};
use sandboxd::sandbox::tar_safety::{TarLimits, extract_archive};
use sandboxd::sandbox::{CreateOptions, Sandbox, WORKSPACE};
use sandboxd::tools::ask_human::{Asker, NoHuman, TerminalAsker};
use sandboxd::tools::session::agent_tools;
use tokio_util::sync::CancellationToken;

use super::Ctx;
use super::exec::LimitFlags;
use super::render;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The task; asked on stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Print the events as JSON lines on stdout instead of rendering them.
    #[arg(long)]
    pub json: bool,
    /// Where /workspace is copied at the end (default ./sandboxd-output/<run-id>); must not
    /// exist yet or be empty.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Keep the sandbox after the run; its session id is printed.
    #[arg(long)]
    pub keep: bool,
    /// Never ask the user (ask_human answers "no human available"); implied when stdin is not a terminal.
    #[arg(long)]
    pub no_input: bool,
    /// Most steps of the run (default [agent] max_steps).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// External MCP servers whose tools the agent may use (format of config/mcp.example.json;
    /// default [mcp] servers_file).
    #[arg(long)]
    pub mcp: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitFlags,
}

pub async fn main(ctx: Ctx, args: RunArgs) -> anyhow::Result<ExitCode> {
    let llm = match LlmClient::from_config(&ctx.config.llm) {
        Ok(c) => Arc::new(c),
        Err(e @ LlmError::NotConfigured { .. }) => {
            eprintln!("sandboxd: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    let task = match args.prompt.clone() {
        Some(p) => p,
        None => read_task()?,
    };
    if task.trim().is_empty() {
        anyhow::bail!("the task is empty; pass --prompt \"...\" or type it on stdin");
    }
    let run_id = new_run_id();
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("sandboxd-output").join(&run_id));
    check_output_dir(&output)?;

    // From here on Ctrl-C cancels the run instead of killing the process, so the container
    // is always removed; a second Ctrl-C gives up at once.
    let cancel = CancellationToken::new();
    let watcher = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nsandboxd: cancelling the run (Ctrl-C again to quit at once)…");
                cancel.cancel();
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!(
                        "sandboxd: quitting; `sandboxd sessions gc` removes the container left behind"
                    );
                    std::process::exit(130);
                }
            }
        })
    };

    let manager = ctx.manager().await?;
    let owner = ctx.owner()?;
    let session = manager
        .create(
            &owner,
            &args.limits.request(),
            CreateOptions { keep: args.keep },
        )
        .await
        .context("cannot create the sandbox session")?;
    let asker: Arc<dyn Asker> = if args.no_input || !std::io::stdin().is_terminal() {
        Arc::new(NoHuman)
    } else {
        Arc::new(TerminalAsker)
    };
    let extractor = Arc::new(sandboxd::agent::extract::LlmExtractor::new(llm.clone()));
    let tools = agent_tools(
        session.sandbox.clone(),
        &session.limits,
        &ctx.config,
        asker,
        Some(extractor),
    );
    let browser = tools.browser.clone();
    let mut settings = AgentSettings::from_config(&ctx.config);
    if let Some(n) = args.max_steps {
        settings.max_steps = n.max(1);
    }
    let mut registry = tools.registry;
    let mut agent_notes = Vec::new();
    let mcp_file = args.mcp.clone().or_else(|| {
        Some(PathBuf::from(&ctx.config.mcp.servers_file)).filter(|p| !p.as_os_str().is_empty())
    });
    let mcp = match mcp_file {
        Some(path) => {
            let clients = sandboxd::mcp::client::connect_all(&path)
                .await
                .with_context(|| format!("cannot use the MCP servers in {}", path.display()))?;
            for (server, why) in clients.failures() {
                eprintln!("sandboxd: MCP server {server} is skipped: {why}");
            }
            let names = clients.register_into(&mut registry);
            if !names.is_empty() {
                eprintln!("sandboxd: MCP tools: {}", names.join(", "));
            }
            agent_notes = clients.system_messages();
            Some(Arc::new(McpRefresh(clients)))
        }
        None => None,
    };
    let mut agent = Agent::new(llm, registry, settings)
        .with_browser(browser.clone())
        .with_system_notes(agent_notes);
    if let Some(hook) = &mcp {
        agent = agent.with_hook(hook.clone());
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let renderer = tokio::spawn(render::render(rx, args.json));
    let request = RunRequest {
        run_id: run_id.clone(),
        task,
        owner: owner.to_string(),
        session_id: session.id.clone(),
    };
    let outcome = if cancel.is_cancelled() {
        None
    } else {
        Some(agent.run(request, Some(tx), cancel.clone()).await)
    };
    let _ = renderer.await;
    browser.shutdown().await;
    if let Some(hook) = &mcp {
        hook.0.close().await;
    }

    match copy_out(session.sandbox.as_ref(), &output).await {
        Ok(0) => eprintln!("sandboxd: /workspace was empty; nothing copied"),
        Ok(n) => eprintln!(
            "sandboxd: /workspace copied to {} ({n} entries)",
            output.display()
        ),
        Err(e) => eprintln!("sandboxd: could not copy /workspace out: {e:#}"),
    }
    if args.keep {
        eprintln!(
            "sandboxd: session {} kept (remove it with `sandboxd sessions rm {}`)",
            session.id, session.id
        );
    } else if let Err(e) = manager.remove(&session.owner, &session.id).await {
        eprintln!(
            "sandboxd: could not remove the container of session {}: {e}",
            session.id
        );
    }
    watcher.abort();
    if let Some(path) = outcome.as_ref().and_then(|o| o.transcript.as_ref()) {
        eprintln!("sandboxd: transcript {}", path.display());
    }
    Ok(match outcome.map(|o| o.reason) {
        Some(r) if r.is_success() => ExitCode::SUCCESS,
        Some(FinishReason::Cancelled) | None => ExitCode::from(130),
        Some(_) => ExitCode::FAILURE,
    })
}

/// Refreshes the MCP servers' tools before every step and announces what changed.
struct McpRefresh(sandboxd::mcp::client::McpClients);

#[async_trait::async_trait]
impl sandboxd::agent::StepHook for McpRefresh {
    async fn before_step(&self, tools: &mut sandboxd::tools::ToolRegistry) -> Vec<String> {
        self.0
            .refresh(tools)
            .await
            .iter()
            .map(|c| c.announcement())
            .collect()
    }
}

/// The task from stdin: one line at a terminal, everything when piped.
fn read_task() -> anyhow::Result<String> {
    let mut text = String::new();
    if std::io::stdin().is_terminal() {
        eprint!("What should the agent do?\n> ");
        std::io::stdin().read_line(&mut text)?;
    } else {
        std::io::stdin().read_to_string(&mut text)?;
    }
    Ok(text.trim().to_string())
}

fn check_output_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() && std::fs::read_dir(dir)?.next().is_none() => Ok(()),
        Ok(_) => anyhow::bail!(
            "the output directory {} exists and is not empty; choose another with --output",
            dir.display()
        ),
    }
}

/// Copies /workspace into `dest` (created), validating the archive as hostile input.
async fn copy_out(sandbox: &dyn Sandbox, dest: &Path) -> anyhow::Result<usize> {
    let archive = sandbox.download_tar(WORKSPACE).await?;
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let dest = dest.to_path_buf();
    let summary = tokio::task::spawn_blocking(move || {
        extract_archive(&archive, &dest, &TarLimits::default())
    })
    .await??;
    Ok(summary.entries.saturating_sub(1))
}
