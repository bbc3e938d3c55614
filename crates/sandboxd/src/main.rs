//! The sandboxd command line. Only argument parsing and dispatch live here; each command
//! group is a file under src/cli/.

mod backends;
mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sandboxd",
    version,
    about = "Run an AI agent whose every tool executes inside a hardened, network-less Docker sandbox."
)]
struct Cli {
    /// Config file (default: config/sandboxd.toml if it exists; env SANDBOXD_CONFIG).
    #[arg(long, global = true, env = "SANDBOXD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent on a task inside a fresh sandbox.
    Run(cli::run::RunArgs),
    /// List the agent profiles `run --agent` and `POST /v1/runs {"agent": …}` accept.
    Agents(cli::agents::AgentsArgs),
    /// Run one command in a fresh sandbox, streaming its output; exits with its exit code.
    Exec(cli::exec::ExecArgs),
    /// An interactive persistent shell in a fresh sandbox.
    Shell(cli::exec::ShellArgs),
    /// Run one tool call without an LLM, or list the tools as the model sees them.
    Tool(cli::tool::ToolArgs),
    /// Serve the sandbox tools over MCP (stdio, or streamable HTTP with --listen).
    Mcp(cli::mcp::McpArgs),
    /// Build or inspect the sandbox image.
    #[command(subcommand)]
    Image(cli::image::ImageCommand),
    /// List, remove or garbage-collect session containers.
    #[command(subcommand)]
    Sessions(cli::sessions::SessionsCommand),
    /// Check Docker, the image, the limits in force and the LLM configuration.
    Doctor,
    /// Serve the multi-user HTTP API (and MCP at /mcp) for the users `users add` creates.
    Serve(cli::serve::ServeArgs),
    /// Add, list, remove users of `serve`; rotate their keys; set their quotas.
    #[command(subcommand)]
    Users(cli::users::UsersCommand),
    /// Users' own egress credentials (list, set from stdin or a variable, remove).
    #[command(subcommand)]
    Egress(cli::egress_credentials::EgressCommand),
    /// Bring in configuration from elsewhere (OpenManus's config.toml and mcp.json).
    #[command(subcommand)]
    Config(cli::config::ConfigCommand),
    /// Measure sandboxd beside the plain docker CLI; prints tables for BENCHMARKS.md.
    Bench(cli::bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_tracing(match cli.command {
        Command::Serve(_) => "warn,sandboxd::access=info,sandboxd_server=info",
        _ => "warn",
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let ctx = cli::Ctx::load(cli.config.as_deref())?;
        let result = match cli.command {
            Command::Run(args) => cli::run::main(ctx, args).await,
            Command::Agents(args) => cli::agents::main(ctx, args).await,
            Command::Exec(args) => cli::exec::exec(ctx, args).await,
            Command::Shell(args) => cli::exec::shell(ctx, args).await,
            Command::Tool(args) => cli::tool::main(ctx, args).await,
            Command::Mcp(args) => cli::mcp::main(ctx, args).await,
            Command::Image(cmd) => cli::image::main(ctx, cmd).await,
            Command::Sessions(cmd) => cli::sessions::main(ctx, cmd).await,
            Command::Doctor => cli::doctor::main(ctx).await,
            Command::Serve(args) => cli::serve::main(ctx, args).await,
            Command::Users(cmd) => cli::users::main(ctx, cmd).await,
            Command::Egress(cmd) => cli::egress_credentials::main(ctx, cmd).await,
            Command::Bench(args) => cli::bench::main(ctx, args).await,
            Command::Config(cmd) => cli::config::main(ctx, cmd).await,
        };
        backends::release_leases().await;
        result
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if let Some(hint) = cli::hint(&e) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}
