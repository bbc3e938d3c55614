//! `sandboxd exec` (one command in a fresh sandbox, output streamed, its exit code ours)
//! and `sandboxd shell` (an interactive persistent shell in a fresh sandbox).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use sandboxd::config::LimitRequest;
use sandboxd::sandbox::manager::Session;
use sandboxd::sandbox::{OutputChunk, SessionManager, ShellOptions, SpawnRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Ctx;

/// Limits a command-line user may lower for one session.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LimitFlags {
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
}

impl LimitFlags {
    pub fn request(&self) -> LimitRequest {
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
pub struct ExecArgs {
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
pub struct ShellArgs {
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
pub async fn open_session(
    ctx: &Ctx,
    manager: &SessionManager,
    session: Option<&str>,
    limits: &LimitFlags,
    keep: bool,
) -> anyhow::Result<Arc<Session>> {
    match session {
        Some(id) => Ok(manager.get(id).await?),
        None => Ok(manager
            .create(&ctx.config.sessions.default_owner, &limits.request(), keep)
            .await
            .context("cannot create the sandbox session")?),
    }
}

/// Removes the session, or says how to reach it again when it is kept.
pub async fn close_session(
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
        manager.remove(&session.id).await?;
    }
    Ok(())
}

pub async fn exec(ctx: Ctx, args: ExecArgs) -> anyhow::Result<ExitCode> {
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
    let result = stream_command(&session, &args.command, Duration::from_secs(args.timeout)).await;
    close_session(&manager, &session, keep).await?;
    result
}

async fn stream_command(
    session: &Session,
    argv: &[String],
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let tag = format!("{:032x}", rand::random::<u128>());
    let mut process = session
        .sandbox
        .spawn(SpawnRequest::new(argv.iter().cloned()).env("SANDBOXD_TAG", tag.clone()))
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
    let outcome = tokio::select! {
        r = tokio::time::timeout(timeout, pump) => match r {
            Ok(r) => r.map(|_| None),
            Err(_) => Ok(Some(format!("timed out after {}s; the command was killed", timeout.as_secs()))),
        },
        _ = tokio::signal::ctrl_c() => Ok(Some("interrupted; the command was killed".to_string())),
    };
    feeder.abort();
    match outcome? {
        Some(why) => {
            session.sandbox.kill_tagged(&tag).await?;
            eprintln!("sandboxd: {why}");
            Ok(ExitCode::from(124))
        }
        None => {
            let code = (process.exit_code)().await.unwrap_or(1);
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
    }
}

pub async fn shell(ctx: Ctx, args: ShellArgs) -> anyhow::Result<ExitCode> {
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
        timeout: Duration::from_secs(ctx.config.limits.max_timeout_secs),
        output_cap: ctx.config.limits.output_cap(),
    };
    let mut last = 0;
    while let Some(line) = rx.recv().await {
        let line = line.trim_end();
        if line == "exit" {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let out = session.sandbox.shell(line, opts.clone()).await?;
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
    close_session(&manager, &session, keep).await?;
    Ok(ExitCode::from(last.clamp(0, 255) as u8))
}
