//! `sandboxd tool`: one tool call without an LLM (issue 3 fills this in).

use std::process::ExitCode;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub struct ToolArgs {
    /// The task; asked on stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
}

pub async fn main(_ctx: Ctx, _args: ToolArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`sandboxd tool` is not built yet")
}
