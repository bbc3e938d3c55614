//! `sandboxd exec` (one command in a fresh sandbox, output streamed, its exit code ours)
//! and `sandboxd shell` (an interactive persistent shell in a fresh sandbox).
//!
//! Both listen for SIGINT, SIGTERM and SIGHUP from their first line: any of them kills the
//! command in flight and removes the session (unless kept), then exits 128 + the signal.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use sandboxd_core::config::LimitRequest;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::shell::oom_kill_count;
use sandboxd_core::sandbox::{
    CreateOptions, OutputChunk, SessionManager, ShellOptions, SpawnRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Ctx;
use super::signals::StopSignals;
use sandboxd_core::config::egress::EgressPolicy;

/// Limits a command-line user may lower for one session.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct LimitFlags {
    /// Memory limit in MiB (at most the configured limit).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// CPU limit in cores (at most the configured limit).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Process limit (at most the configured limit).
    #[arg(long)]
    pub pids: Option<i64>,
    /// Size of /workspace in MiB (at most the configured limit).
    #[arg(long)]
    pub workspace_mb: Option<u64>,
    /// Which hosts the sandbox may reach through its egress proxy: "off", "any" or
    /// "a.org,*.b.org,!c.b.org" (default: [egress] default; at most [egress] widest).
    #[arg(long, value_name = "POLICY")]
    pub egress: Option<EgressPolicy>,
    /// The image to make the sandbox from: "default" or one of the config's [[templates]]
    /// (built with `sandboxd image build --template NAME`).
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
}

impl LimitFlags {
    pub(crate) fn request(&self) -> LimitRequest {
        LimitRequest {
            memory_mb: self.memory_mb,
            cpus: self.cpus,
            pids: self.pids,
            workspace_mb: self.workspace_mb,
            tmp_mb: None,
        }
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct ExecArgs {
    /// Keep the sandbox after the command; its session id is printed on stderr.
    #[arg(long)]
    pub keep: bool,
    /// Run in an existing (kept) session instead of a fresh one.
    #[arg(long)]
    pub session: Option<String>,
    /// Seconds before the command is killed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ShellArgs {
    /// Keep the sandbox after the shell exits.
    #[arg(long)]
    pub keep: bool,
    /// Attach to an existing (kept) session instead of a fresh one.
    #[arg(long)]
    pub session: Option<String>,
    #[command(flatten)]
    pub limits: LimitFlags,
}

/// A fresh session, or the named kept one.
pub(crate) async fn open_session(
    ctx: &Ctx,
    manager: &SessionManager,
    session: Option<&str>,
    limits: &LimitFlags,
    keep: bool,
) -> anyhow::Result<Arc<Session>> {
    let owner = ctx.owner()?;
    // Checked before a sandbox is made for nothing.
    let egress = super::egress::policy(ctx, limits.egress.as_ref())?;
    let session = match session {
        Some(_) if limits.template.is_some() => {
            anyhow::bail!("--template names the image of a new session; drop it or --session")
        }
        Some(id) => manager.get(&owner, id).await?,
        None => {
            let template = manager.templates().resolve(limits.template.as_deref())?;
            manager
                .create_from(
                    &owner,
                    &limits.request(),
                    CreateOptions { keep },
                    template.image,
                )
                .await
                .context("cannot create the sandbox session")?
        }
    };
    super::egress::start(ctx, &session, &egress).await;
    Ok(session)
}

/// Removes the session, or says how to reach it again when it is kept.
pub(crate) async fn close_session(
    manager: &SessionManager,
    session: &Session,
    keep: bool,
) -> anyhow::Result<()> {
    if keep {
        eprintln!(
            "sandboxd: session {} kept (reuse it with --session {}, remove it with `sandboxd sessions rm {}`)",
            session.id, session.id, session.id
        );
    } else {
        manager.remove(&session.owner, &session.id).await?;
    }
    Ok(())
}

pub(crate) async fn exec(ctx: Ctx, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut stop = StopSignals::listen().context("cannot listen for signals")?;
    let manager = ctx.manager().await?;
    let keep = args.keep || args.session.is_some();
    let session = open_session(
        &ctx,
        &manager,
        args.session.as_deref(),
        &args.limits,
        args.keep,
    )
    .await?;
    let command = Command {
        argv: &args.command,
        timeout: Duration::from_secs(args.timeout),
        fresh: args.session.is_none(),
    };
    let result = stream_command(&session, command, &mut stop).await;
    close_session(&manager, &session, keep).await?;
    result
}

/// One `sandboxd exec` command.
struct Command<'a> {
    argv: &'a [String],
    timeout: Duration,
    /// The session was made for this command, so nothing ran in it before.
    fresh: bool,
}

async fn stream_command(
    session: &Session,
    command: Command<'_>,
    stop: &mut StopSignals,
) -> anyhow::Result<ExitCode> {
    // An OOM kill shows only as exit 137 (SIGKILL); the cgroup's counter tells it apart
    // from any other SIGKILL. A fresh sandbox starts at zero, so only a reused one is read.
    let oom_before = if command.fresh {
        Some(0)
    } else {
        oom_kill_count(session.sandbox.as_ref()).await
    };
    let tag = format!("{:032x}", rand::random::<u128>());
    let mut process = session
        .sandbox
        .spawn(SpawnRequest::new(command.argv.iter().cloned()).env("SANDBOXD_TAG", tag.clone()))
        .await?;
    // Forward our stdin when it is a pipe or a file; a terminal gets EOF, like the tools.
    let mut stdin = process.stdin;
    let feeder = tokio::spawn(async move {
        if !std::io::stdin().is_terminal() {
            let mut input = tokio::io::stdin();
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = input.read(&mut buf).await {
                if n == 0 || stdin.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
        let _ = stdin.shutdown().await;
    });
    let pump = async {
        let mut out = tokio::io::stdout();
        let mut err = tokio::io::stderr();
        while let Some(chunk) = process.output.next().await {
            match chunk? {
                OutputChunk::Stdout(b) => {
                    out.write_all(&b).await?;
                    out.flush().await?;
                }
                OutputChunk::Stderr(b) => {
                    err.write_all(&b).await?;
                    err.flush().await?;
                }
            }
        }
        anyhow::Ok(())
    };
    let timeout = command.timeout;
    let outcome = tokio::select! {
        r = tokio::time::timeout(timeout, pump) => match r {
            Ok(r) => r.map(|_| None),
            Err(_) => Ok(Some((format!("timed out after {}s; the command was killed", timeout.as_secs()), 124))),
        },
        sig = stop.recv() => Ok(Some((format!("{}: the command was killed", sig.name()), sig.exit_status()))),
    };
    feeder.abort();
    match outcome? {
        Some((why, status)) => {
            session.sandbox.kill_tagged(&tag).await?;
            eprintln!("sandboxd: {why}");
            Ok(ExitCode::from(status))
        }
        None => {
            let code = (process.exit_code)().await.unwrap_or(1);
            if code == 137
                && let Some(before) = oom_before
                && oom_kill_count(session.sandbox.as_ref())
                    .await
                    .is_some_and(|now| now > before)
            {
                eprintln!(
                    "sandboxd: the command was killed by the out-of-memory killer: it reached the sandbox's memory limit of {} MiB (lower use, or ask for more with --memory-mb up to the configured maximum)",
                    session.limits.memory_mb
                );
            }
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
    }
}

pub(crate) async fn shell(ctx: Ctx, args: ShellArgs) -> anyhow::Result<ExitCode> {
    let mut stop = StopSignals::listen().context("cannot listen for signals")?;
    let manager = ctx.manager().await?;
    let keep = args.keep || args.session.is_some();
    let session = open_session(
        &ctx,
        &manager,
        args.session.as_deref(),
        &args.limits,
        args.keep,
    )
    .await?;
    eprintln!(
        "sandboxd: session {} — a persistent bash in the sandbox (no network, files in /workspace). `exit` or Ctrl-D leaves.",
        session.id
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let interactive = stdin.is_terminal();
        loop {
            if interactive {
                eprint!("sandbox$ ");
                let _ = std::io::stderr().flush();
            }
            let mut line = String::new();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.blocking_send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let opts = ShellOptions {
        timeout: Duration::from_secs(session.limits.max_timeout_secs),
        output_cap: session.limits.output_cap(),
    };
    // Errors end the loop but never skip the removal below.
    let last = shell_loop(&session, &mut rx, &mut stop, &opts).await;
    close_session(&manager, &session, keep).await?;
    Ok(ExitCode::from(last?.clamp(0, 255) as u8))
}

/// Runs the lines read from stdin until `exit`, EOF or a stop signal; the last exit code.
async fn shell_loop(
    session: &Session,
    lines: &mut tokio::sync::mpsc::Receiver<String>,
    stop: &mut StopSignals,
    opts: &ShellOptions,
) -> anyhow::Result<i32> {
    let mut last = 0;
    loop {
        let line = tokio::select! {
            line = lines.recv() => line,
            sig = stop.recv() => {
                eprintln!("sandboxd: {}; leaving the shell", sig.name());
                return Ok(i32::from(sig.exit_status()));
            }
        };
        let Some(line) = line else { return Ok(last) };
        let line = line.trim_end();
        if line == "exit" {
            return Ok(last);
        }
        if line.trim().is_empty() {
            continue;
        }
        let out = tokio::select! {
            out = session.sandbox.shell(line, opts.clone()) => out?,
            sig = stop.recv() => {
                eprintln!("sandboxd: {}; the command was killed", sig.name());
                return Ok(i32::from(sig.exit_status()));
            }
        };
        std::io::stdout().write_all(&out.stdout)?;
        std::io::stdout().flush()?;
        std::io::stderr().write_all(&out.stderr)?;
        if let Some(note) = &out.note {
            eprintln!("[sandboxd: {note}]");
        }
        if out.timed_out {
            eprintln!("[sandboxd: timed out; the command was killed]");
        }
        last = out.exit_code.unwrap_or(1);
    }
}
