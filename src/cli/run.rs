//! `sandboxd run --prompt`: the agent on a task in a fresh sandbox (issue 4 fills this in).

use std::process::ExitCode;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The task; asked on stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
}

pub async fn main(_ctx: Ctx, _args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`sandboxd run` is not built yet")
}
