//! `sandboxd tool NAME 'JSON-ARGS' [--session ID]`: one tool call without an LLM, exactly as
//! the model would make it; `sandboxd tool --list`: the tools as the model sees them.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use sandboxd_core::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd_core::sandbox::{AttachedProcess, Sandbox, SandboxError, SpawnRequest};
use sandboxd_core::tools::ToolContext;
use sandboxd_core::tools::ask_human::{Asker, NoHuman, TerminalAsker};
use sandboxd_core::tools::session::{SessionTools, agent_tools};

use super::Ctx;
use super::exec::{LimitFlags, close_session, open_session};

#[derive(clap::Args, Debug)]
pub(crate) struct ToolArgs {
    /// The tool to call (see --list).
    pub name: Option<String>,
    /// Its arguments, a JSON object as the model would send it (default {}).
    pub args: Option<String>,
    /// Print the tools in OpenAI function format, as the model sees them.
    #[arg(long)]
    pub list: bool,
    /// Run in an existing (kept) session instead of a fresh one.
    #[arg(long)]
    pub session: Option<String>,
    /// Keep the fresh session afterwards; its id is printed on stderr.
    #[arg(long)]
    pub keep: bool,
    /// Print the whole result (output, error, image, system) as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub limits: LimitFlags,
}

pub(crate) async fn main(ctx: Ctx, args: ToolArgs) -> anyhow::Result<ExitCode> {
    let asker: Arc<dyn Asker> = if std::io::stdin().is_terminal() {
        Arc::new(TerminalAsker)
    } else {
        Arc::new(NoHuman)
    };
    if args.list {
        // The tools are described over a sandbox that refuses every call: listing creates no
        // container, builds no image and works without Docker.
        let detached: Arc<dyn Sandbox> = Arc::new(ExecSandbox::new(
            Detached,
            String::new(),
            ctx.config.limits.clone(),
        ));
        let registry = agent_tools(detached, &ctx.config.limits, &ctx.config, asker, None).registry;
        println!("{}", serde_json::to_string_pretty(&registry.to_openai())?);
        return Ok(ExitCode::SUCCESS);
    }
    let Some(name) = args.name.as_deref() else {
        anyhow::bail!(
            "name a tool (sandboxd tool bash '{{\"command\":\"ls\"}}'), or use --list to see them"
        );
    };
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
    // The session's own tools, as a run in this session gets them: a kept session's python
    // interpreter, browser and undo history are the ones its runs use.
    let tools = SessionTools::of(&session, &ctx.config);
    let registry = tools.agent_registry(asker);
    let result = registry
        .execute(
            name,
            args.args.as_deref().unwrap_or("{}"),
            &ToolContext::default(),
        )
        .await;
    if !keep {
        tools.browser.shutdown().await;
    }
    close_session(&manager, &session, keep).await?;
    let result = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!("{}", result.render());
        if let Some(img) = &result.base64_image {
            eprintln!(
                "[an image came back ({} base64 characters); --json prints it]",
                img.len()
            );
        }
    }
    Ok(if result.is_error() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The backend of the sandbox `tool --list` describes the tools over: there is none.
struct Detached;

#[async_trait]
impl ExecBackend for Detached {
    async fn spawn(
        &self,
        _req: &SpawnRequest,
        _attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError> {
        Err(SandboxError::InvalidRequest(
            "`tool --list` has no sandbox; call a tool without --list".into(),
        ))
    }

    async fn is_alive(&self) -> bool {
        false
    }
}
