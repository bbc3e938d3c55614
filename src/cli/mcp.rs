//! `sandboxd mcp`: the MCP server (issue 6 fills this in).

use std::process::ExitCode;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// The task; asked on stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
}

pub async fn main(_ctx: Ctx, _args: McpArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`sandboxd mcp` is not built yet")
}
