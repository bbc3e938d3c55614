//! `sandboxd run --prompt "..."`: the agent on one task, in a fresh sandbox session or, with
//! `--session ID`, continuing a kept one (same container, same conversation).
//!
//! This file only parses arguments and wires the terminal: the run itself is
//! `agent::run_in_session`. Order matters: the LLM configuration is checked before anything
//! is created, so a missing key costs nothing and says what to set. Ctrl-C, SIGTERM and
//! SIGHUP cancel the run (killing the command in flight) and the session's lease removes
//! the container unless it is kept; /workspace is copied out on the way (copy_out.rs).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::Context as _;
use sandboxd_core::agent::profiles::Profiles;
use sandboxd_core::agent::{
    FinishReason, History, RunContext, RunError, RunRequest, SessionLease, new_run_id,
    run_in_session,
};
use sandboxd_core::flow::FlowStatus;
use sandboxd_core::llm::{LlmClient, LlmError};
use sandboxd_core::sandbox::copy_in::copy_in;
use sandboxd_core::tools::ask_human::{Asker, NoHuman, TerminalAsker};
use sandboxd_core::tools::session::SessionTools;
use tokio_util::sync::CancellationToken;

use super::Ctx;
use super::copy_out::{COPY_INCOMPLETE, check_output_dir, copy_out};
use super::exec::{LimitFlags, open_session};
use super::render::{TerminalSink, sayln};
use super::signals::StopSignals;

#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
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
    /// Run the task as a plan: one LLM call writes the steps, each step is its own agent
    /// run in the same sandbox, a summary closes it ([flow] in the config).
    #[arg(long)]
    pub plan: bool,
    /// The agent profile: its tools, prompt and step limit (`sandboxd agents` lists them;
    /// default "general"). With --plan, the planner's step tags name profiles instead.
    #[arg(long, value_name = "NAME", conflicts_with = "plan")]
    pub agent: Option<String>,
    /// Files or directories copied into /workspace before the run (by their base name).
    #[arg(long, value_name = "PATH", num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Keep the sandbox after the run; its session id is printed (continue it with --session).
    #[arg(long)]
    pub keep: bool,
    /// Continue a kept session: same container, and the model sees its earlier runs.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// With --session: start the conversation afresh (the container's state stays).
    #[arg(long, requires = "session")]
    pub fresh: bool,
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

/// The exit status of the signal that cancelled the run (0: none yet).
static CANCELLED_BY: AtomicU8 = AtomicU8::new(0);

pub(crate) async fn main(ctx: Ctx, args: RunArgs) -> anyhow::Result<ExitCode> {
    let llm = match LlmClient::from_config(&ctx.config.llm) {
        Ok(c) => Arc::new(c),
        Err(e @ LlmError::NotConfigured { .. }) => {
            sayln!("sandboxd: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    let profiles = Profiles::from_config(&ctx.config)?;
    let profile = match profiles.get(args.agent.as_deref()) {
        Ok(p) => p.clone(),
        Err(e) => {
            sayln!("sandboxd: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let task = checked_task(&args)?;
    let run_id = new_run_id();
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("sandboxd-output").join(&run_id));
    check_output_dir(&output)?;

    // From here on Ctrl-C, SIGTERM and SIGHUP cancel the run instead of killing the
    // process, so the container is always removed; a second signal gives up at once.
    let cancel = CancellationToken::new();
    let watcher = watch_signals(cancel.clone())?;

    let manager = ctx.manager().await?;
    let keep = args.keep || args.session.is_some();
    let session = open_session(&ctx, &manager, args.session.as_deref(), &args.limits, keep).await?;
    let lease = SessionLease::new(manager, session, keep);
    if !args.input.is_empty() {
        let session = lease.session();
        let placed = copy_in(session.sandbox.as_ref(), &session.limits, &args.input).await;
        match placed {
            Ok(placed) => sayln!("sandboxd: copied in: {}", placed.join(", ")),
            Err(e) => {
                watcher.abort();
                let _ = lease.release().await;
                return Err(e).context("--input");
            }
        }
    }
    let request = RunRequest {
        run_id,
        task,
        max_steps: args.max_steps,
        mcp_servers: args.mcp.clone().or_else(|| {
            Some(PathBuf::from(&ctx.config.mcp.servers_file)).filter(|p| !p.as_os_str().is_empty())
        }),
        history: if args.fresh {
            History::Fresh
        } else {
            History::Session
        },
        shape: Default::default(),
    }
    .with_profile(&profile);
    let run_ctx = RunContext::new(llm, ctx.config.clone());
    let result = run_task(&run_ctx, &args, &lease, request, &cancel).await;

    let copied = close_session(&ctx, lease, &output).await;
    watcher.abort();
    let ended = match result {
        Some(Ok(ended)) => Some(ended),
        Some(Err(e)) => return Err(e).context("the run did not start"),
        None => None,
    };
    if let Some(Ended::Run(o)) = &ended
        && let Some(path) = &o.transcript
    {
        sayln!("sandboxd: transcript {}", path.display());
    }
    Ok(exit_code(ended.as_ref(), copied))
}

/// The task (from --prompt or stdin), once the flags are known to fit together.
fn checked_task(args: &RunArgs) -> anyhow::Result<String> {
    let l = &args.limits;
    let limits_given =
        l.memory_mb.is_some() || l.cpus.is_some() || l.pids.is_some() || l.workspace_mb.is_some();
    if args.session.is_some() && limits_given {
        anyhow::bail!(
            "--memory, --cpus, --pids and --workspace set the limits of a new session; a kept session keeps its own (drop them or --session)"
        );
    }
    let task = match args.prompt.clone() {
        Some(p) => p,
        None => read_task()?,
    };
    if task.trim().is_empty() {
        anyhow::bail!("the task is empty; pass --prompt \"...\" or type it on stdin");
    }
    Ok(task)
}

/// Runs the task (a plan with --plan) with the terminal as its sink; None when a signal came
/// before it started.
async fn run_task(
    run_ctx: &RunContext,
    args: &RunArgs,
    lease: &SessionLease,
    request: RunRequest,
    cancel: &CancellationToken,
) -> Option<Result<Ended, RunError>> {
    let asker: Arc<dyn Asker> = if args.no_input || !std::io::stdin().is_terminal() {
        Arc::new(NoHuman)
    } else {
        Arc::new(TerminalAsker)
    };
    let terminal = TerminalSink::start(args.json);
    let result = if cancel.is_cancelled() {
        None
    } else if args.plan {
        let flow = super::plan::run_flow(
            run_ctx,
            lease.session(),
            request,
            asker,
            terminal.clone(),
            cancel.clone(),
        )
        .await;
        Some(Ok(Ended::Flow(Box::new(flow))))
    } else {
        Some(
            run_in_session(
                run_ctx,
                lease.session(),
                request,
                asker,
                terminal.clone(),
                cancel.clone(),
            )
            .await
            .map(Ended::Run),
        )
    };
    terminal.finish().await;
    result
}

/// Stops the browser of a session not kept, copies /workspace out to `output`, and releases
/// the lease (removing the container unless kept). Returns whether the copy-out was complete.
async fn close_session(ctx: &Ctx, lease: SessionLease, output: &std::path::Path) -> bool {
    let session = lease.session().clone();
    // A kept session's Chromium stays for the next process, which adopts it from the
    // session's host-side record; otherwise it is stopped before the copy-out.
    if !lease.kept() {
        SessionTools::of(&session, &ctx.config)
            .browser
            .shutdown()
            .await;
    }
    let copied = copy_out(session.sandbox.as_ref(), &session.limits, output).await;
    if lease.kept() {
        sayln!(
            "sandboxd: session {id} kept (continue it with `sandboxd run --session {id} --prompt …`, remove it with `sandboxd sessions rm {id}`)",
            id = session.id
        );
    }
    if let Err(e) = lease.release().await {
        sayln!(
            "sandboxd: could not remove the container of session {}: {e}",
            session.id
        );
    }
    copied
}

/// The process's status: success only when the run succeeded and its files all arrived; the
/// cancelling signal's status after a cancel.
fn exit_code(ended: Option<&Ended>, copied: bool) -> ExitCode {
    let (success, cancelled) = match ended {
        Some(Ended::Run(o)) => (o.reason.is_success(), o.reason == FinishReason::Cancelled),
        Some(Ended::Flow(f)) => (f.status.is_success(), f.status == FlowStatus::Cancelled),
        None => (false, true),
    };
    if success && !copied {
        // The agent succeeded but the user's deliverables did not all arrive.
        ExitCode::from(COPY_INCOMPLETE)
    } else if success {
        ExitCode::SUCCESS
    } else if cancelled {
        let status = CANCELLED_BY.load(Ordering::SeqCst);
        ExitCode::from(if status > 0 { status } else { 130 })
    } else {
        ExitCode::FAILURE
    }
}

/// How `run` ended: one agent run, or a planning flow (`--plan`).
enum Ended {
    Run(sandboxd_core::agent::RunOutcome),
    Flow(Box<sandboxd_core::flow::FlowOutcome>),
}

/// Cancels `cancel` on the first Ctrl-C, SIGTERM or SIGHUP (what `timeout`, systemd, CI
/// runners and a closed terminal send); a second one quits at once.
fn watch_signals(cancel: CancellationToken) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut signals = StopSignals::listen().context("cannot watch the stop signals")?;
    Ok(tokio::spawn(async move {
        let first = signals.recv().await;
        CANCELLED_BY.store(first.exit_status(), Ordering::SeqCst);
        sayln!(
            "\nsandboxd: {}: cancelling the run (again to quit at once)…",
            first.name()
        );
        cancel.cancel();
        let second = signals.recv().await;
        sayln!("sandboxd: quitting; `sandboxd sessions gc` removes the container left behind");
        std::process::exit(i32::from(second.exit_status()));
    }))
}

/// The task from stdin: one line at a terminal, everything when piped.
fn read_task() -> anyhow::Result<String> {
    let mut text = String::new();
    if std::io::stdin().is_terminal() {
        let mut err = std::io::stderr();
        let _ = write!(err, "What should the agent do?\n> ");
        std::io::stdin().read_line(&mut text)?;
    } else {
        std::io::stdin().read_to_string(&mut text)?;
    }
    Ok(text.trim().to_string())
}
