//! `sandboxd bench`: benchmarks beside the docker CLI.

use std::process::ExitCode;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The task; asked on stdin when absent.
    #[arg(long)]
    pub prompt: Option<String>,
}

pub async fn main(_ctx: Ctx, _args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`sandboxd bench` is not built yet")
}
