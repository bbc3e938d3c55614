//! `sandboxd sessions list | rm ID | gc`: the session containers on this engine. The
//! command line is the admin's view: it sees and may remove every owner's sessions. None of
//! these commands creates a session, so none of them builds the image.

use std::process::ExitCode;

use sandboxd::sandbox::{Viewer, host};

use super::Ctx;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum SessionsCommand {
    /// List every sandboxd-managed container.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a session and its container.
    Rm { id: String },
    /// Remove containers whose creating process is gone (and that were not kept) or that stopped.
    Gc,
}

pub(crate) async fn main(ctx: Ctx, cmd: SessionsCommand) -> anyhow::Result<ExitCode> {
    let manager = ctx.read_only_manager().await?;
    match cmd {
        SessionsCommand::List { json } => {
            let list = manager.list(&Viewer::Admin).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.is_empty() {
                println!("no sessions");
            } else {
                println!(
                    "{:<14} {:<12} {:<10} {:<6} {:<8} CONTAINER",
                    "SESSION", "OWNER", "STATE", "KEPT", "PID"
                );
                for s in list {
                    println!(
                        "{:<14} {:<12} {:<10} {:<6} {:<8} {}",
                        s.session_id,
                        // A warm-pool sandbox has no owner label: unclaimed, or claimed by
                        // a session of the process in the PID column.
                        if s.pooled && s.owner.is_empty() {
                            "(pool)"
                        } else {
                            &s.owner
                        },
                        s.state,
                        if s.kept { "yes" } else { "no" },
                        s.creator
                            .as_deref()
                            .and_then(host::creator_pid)
                            .map(|p| p.to_string())
                            .unwrap_or_else(|| "-".into()),
                        &s.handle[..s.handle.len().min(12)]
                    );
                }
            }
        }
        SessionsCommand::Rm { id } => {
            manager.admin_remove(&id).await?;
            println!("removed session {id}");
        }
        SessionsCommand::Gc => {
            let removed = manager.reconcile().await?;
            if removed.is_empty() {
                println!("nothing to remove");
            } else {
                println!(
                    "removed {} orphaned session(s): {}",
                    removed.len(),
                    removed.join(", ")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
