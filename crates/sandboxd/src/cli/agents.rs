//! `sandboxd agents`: the agent profiles this config offers (built-in and `[[agents]]`),
//! as `run --agent NAME`, `POST /v1/runs {"agent": NAME}` and the planner's step tags see
//! them. The list itself is `agent::profiles::Profiles`; this file only prints it.

use std::process::ExitCode;

use sandboxd_core::agent::profiles::Profiles;

use super::Ctx;

#[derive(clap::Args, Debug)]
pub(crate) struct AgentsArgs {
    /// Print the profiles as one JSON array (prompts included) instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) async fn main(ctx: Ctx, args: AgentsArgs) -> anyhow::Result<ExitCode> {
    let profiles = Profiles::from_config(&ctx.config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(profiles.list())?);
        return Ok(ExitCode::SUCCESS);
    }
    let default_steps = ctx.config.agent.max_steps;
    for p in profiles.list() {
        let origin = if p.user_defined { " (config)" } else { "" };
        println!("{}{origin}: {}", p.name, p.description);
        let tools = p
            .tools
            .as_ref()
            .map_or_else(|| "all".to_string(), |t| t.join(", "));
        let steps = p.max_steps.unwrap_or(default_steps);
        println!("    tools: {tools} (and terminate); at most {steps} steps");
    }
    Ok(ExitCode::SUCCESS)
}
