//! `sandboxd sessions list | rm ID | gc`: the session containers on this engine, and
//! serve's hibernated sessions (no container: their /workspace is a snapshot on the host;
//! from the store, if there is one). The command line is the admin's view: it sees and may
//! remove every owner's sessions. None of these commands creates a session, so none of
//! them builds the image. Hibernating or resuming one by hand is serve's
//! (`POST /v1/sessions/{id}/hibernate|resume`, or the admin page), which holds the session.

use std::process::ExitCode;

use sandboxd_core::sandbox::{SandboxError, SessionInfo, Viewer, host};

use super::Ctx;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum SessionsCommand {
    /// List every sandboxd-managed container, then serve's hibernated sessions (state
    /// `hibernated`, no container).
    List {
        /// Print JSON instead of a table: one object per sandbox with its `session_id`,
        /// `owner`, `handle` (the backend's name for it: the Docker container id), `state`,
        /// `kept`, `creator` and `pooled`.
        #[arg(long)]
        json: bool,
    },
    /// Remove a session and its container (or, if its container is already gone, the tool
    /// records it left).
    Rm { id: String },
    /// Remove containers whose creating process is gone (and that were not kept) or that
    /// stopped, and the tool records of sessions that have no container any more.
    Gc,
}

pub(crate) async fn main(ctx: Ctx, cmd: SessionsCommand) -> anyhow::Result<ExitCode> {
    let manager = ctx.read_only_manager().await?;
    match cmd {
        SessionsCommand::List { json } => {
            let list = manager.list(&Viewer::Admin).await?;
            print_list(&list, &hibernated(&ctx).await, json)?;
        }
        SessionsCommand::Rm { id } => match manager.admin_remove(&id).await {
            Ok(()) => println!("removed session {id}"),
            // To the admin, "not found" means no container has that id at all. A kept session
            // whose container was removed outside sandboxd (`docker rm -f`) leaves only its
            // tool records, and the local admin may drop them without an owner check: they
            // are files in the admin's own data directory. (serve's clients never reach
            // this: the manager's owner-checked removal touches nothing it cannot find.)
            Err(not_found @ SandboxError::SessionNotFound { .. }) => {
                let kinds = manager.forget_records(&id).await;
                if kinds.is_empty() {
                    return Err(not_found.into());
                }
                println!(
                    "session {id} was already gone (no container has that id); removed the tool records it left: {}",
                    kinds.join(", ")
                );
            }
            Err(e) => return Err(e.into()),
        },
        SessionsCommand::Gc => {
            let removed = manager.reconcile().await?;
            let records = manager.forget_orphan_records().await?;
            if removed.is_empty() && records.is_empty() {
                println!("nothing to remove");
            }
            if !removed.is_empty() {
                println!(
                    "removed {} orphaned session(s): {}",
                    removed.len(),
                    removed.join(", ")
                );
            }
            if !records.is_empty() {
                println!(
                    "removed the tool records of {} session(s) whose container is gone: {}",
                    records.len(),
                    records.join(", ")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// serve's hibernated sessions, (session id, owner as its containers name it), from the
/// store if one exists; none when it cannot be read (said on stderr).
async fn hibernated(ctx: &Ctx) -> Vec<(String, String)> {
    let store = match crate::backends::existing_store(&ctx.config).await {
        Ok(Some(store)) => store,
        Ok(None) => return Vec::new(),
        Err(e) => {
            eprintln!("note: serve's hibernated sessions are not listed: {e:#}");
            return Vec::new();
        }
    };
    match store.active_sessions().await {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.hibernated())
            .map(|r| (r.id, format!("serve:{}", r.owner)))
            .collect(),
        Err(e) => {
            eprintln!("note: serve's hibernated sessions are not listed: {e}");
            Vec::new()
        }
    }
}

/// `sessions list`'s output: the containers, then the hibernated sessions.
fn print_list(
    list: &[SessionInfo],
    hibernated: &[(String, String)],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let mut all = serde_json::to_value(list)?;
        if let Some(all) = all.as_array_mut() {
            all.extend(hibernated.iter().map(|(id, owner)| {
                serde_json::json!({"session_id": id, "owner": owner, "state": "hibernated",
                            "handle": null, "kept": true, "creator": null, "pooled": false})
            }));
        }
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else if list.is_empty() && hibernated.is_empty() {
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
        for (id, owner) in hibernated {
            println!(
                "{:<14} {:<12} {:<10} {:<6} {:<8} -",
                id, owner, "hibernated", "yes", "-"
            );
        }
    }
    Ok(())
}
