//! `sandboxd users`: add, list, remove users of `sandboxd serve`, rotate their keys and set
//! their quotas. Works on the store directly, also while the service runs.

use std::process::ExitCode;

use anyhow::bail;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::store::{QuotaOverride, Store, now_ms};
use sandboxd_server::accounts::{self, AccountError, expiry};
use sandboxd_server::quota::Quota;
use serde_json::json;

use super::Ctx;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum UsersCommand {
    /// Create a user and print their API key (shown only this once).
    Add {
        name: String,
        /// Admins see and manage every user's objects.
        #[arg(long)]
        admin: bool,
        /// The key stops working after this many days.
        #[arg(long, value_name = "DAYS")]
        expires_in_days: Option<u32>,
        #[command(flatten)]
        quota: QuotaArgs,
    },
    /// List users (never their keys).
    List,
    /// Remove a user: their key stops working and their sessions end.
    Rm { name: String },
    /// Replace a user's key with a new one (printed once); the old one stops working.
    Rotate {
        name: String,
        #[arg(long, value_name = "DAYS")]
        expires_in_days: Option<u32>,
    },
    /// Override a user's quota (unset values keep the [quotas] defaults).
    Quota {
        name: String,
        #[command(flatten)]
        quota: QuotaArgs,
    },
    /// What users used, per UTC day (usage metering): CPU-seconds, memory GiB-seconds,
    /// wall-clock seconds, bytes in and out, tool calls, tokens.
    Usage {
        /// Only this user (default: everyone).
        name: Option<String>,
        /// How many UTC days back, today included (1 to 400).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=400))]
        days: u32,
        /// Print CSV (one row per user and day) instead of a table.
        #[arg(long)]
        csv: bool,
    },
}

#[derive(clap::Args, Debug, Default)]
pub(crate) struct QuotaArgs {
    /// Sessions alive at once.
    #[arg(long)]
    sessions: Option<u32>,
    /// Runs in flight at once.
    #[arg(long)]
    runs: Option<u32>,
    /// LLM input tokens per UTC day (0 = no limit).
    #[arg(long)]
    input_tokens_per_day: Option<u64>,
    /// CPU-seconds of the user's sandboxes per UTC day (0 = no limit); once spent, no new
    /// session, command, tool call or run starts until 00:00 UTC. Upgrading replicas: set it
    /// only once every replica runs this version (an older one cannot read a user whose
    /// stored quota has it).
    #[arg(long)]
    cpu_seconds_per_day: Option<u64>,
    /// Ceilings of what the user's sessions may ask for (never above [limits]).
    #[arg(long)]
    memory_mb: Option<u64>,
    #[arg(long)]
    cpus: Option<f64>,
    #[arg(long)]
    pids: Option<i64>,
    #[arg(long)]
    workspace_mb: Option<u64>,
    #[arg(long)]
    tmp_mb: Option<u64>,
    /// The widest egress policy the user's sessions may have ("off", "any",
    /// "a.org,*.b.org"); never wider than [egress] widest, which is checked too.
    #[arg(long, value_name = "POLICY")]
    egress: Option<EgressPolicy>,
}

impl QuotaArgs {
    fn to_override(&self) -> QuotaOverride {
        QuotaOverride {
            sessions: self.sessions,
            runs: self.runs,
            input_tokens_per_day: self.input_tokens_per_day,
            cpu_seconds_per_day: self.cpu_seconds_per_day,
            memory_mb: self.memory_mb,
            cpus: self.cpus,
            pids: self.pids,
            workspace_mb: self.workspace_mb,
            tmp_mb: self.tmp_mb,
            egress: self.egress.clone(),
        }
    }
}

fn when(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
        .unwrap_or_else(|| "-".into())
}

pub(crate) async fn main(ctx: Ctx, cmd: UsersCommand) -> anyhow::Result<ExitCode> {
    let store = crate::backends::store(&ctx.config).await?;
    match cmd {
        UsersCommand::Add {
            name,
            admin,
            expires_in_days,
            quota,
        } => {
            add(store.as_ref(), &name, admin, expires_in_days, &quota).await?;
            let details = json!({"admin": admin, "expires_in_days": expires_in_days});
            audit(&ctx, store.as_ref(), "user.create", &name, details).await;
        }
        UsersCommand::List => list(&ctx, store.as_ref()).await?,
        UsersCommand::Rm { name } => {
            match accounts::remove(store.as_ref(), &name).await {
                Ok(live) => {
                    let details = json!({"sessions_ended": live.len()});
                    audit(&ctx, store.as_ref(), "user.remove", &name, details).await;
                }
                Err(AccountError::NoSuchUser(_)) => {
                    bail!("no user named {name:?} (see `sandboxd users list`)")
                }
                Err(e) => return Err(e.into()),
            }
            eprintln!(
                "removed {name}; their sessions are ended and a running `sandboxd serve` removes their containers within [sessions] reap_interval_secs"
            );
        }
        UsersCommand::Rotate {
            name,
            expires_in_days,
        } => {
            let text = match accounts::rotate(store.as_ref(), &name, expiry(expires_in_days)).await
            {
                Ok((u, text)) => {
                    let details = json!({"key_prefix": u.key_prefix});
                    audit(&ctx, store.as_ref(), "key.rotate", &name, details).await;
                    text
                }
                Err(AccountError::NoSuchUser(_)) => {
                    bail!("no user named {name:?} (see `sandboxd users list`)")
                }
                Err(e) => return Err(e.into()),
            };
            eprintln!("{name} has a new API key (the old one no longer works), shown only now:");
            println!("{text}");
        }
        UsersCommand::Quota { name, quota } => {
            set_quota(&ctx, store.as_ref(), &name, &quota).await?
        }
        UsersCommand::Usage { name, days, csv } => {
            usage(store.as_ref(), name.as_deref(), days, csv).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `users quota NAME …`: the overrides merged into the user's, recorded, and the result shown.
async fn set_quota(
    ctx: &Ctx,
    store: &dyn Store,
    name: &str,
    quota: &QuotaArgs,
) -> anyhow::Result<()> {
    let Some(u) = store.user_by_name(name).await? else {
        bail!("no user named {name:?} (see `sandboxd users list`)");
    };
    let merged = u.quota.merged(&quota.to_override());
    store.set_quota(name, merged.clone()).await?;
    let details = serde_json::to_value(&merged).unwrap_or_default();
    audit(ctx, store, "user.quota", name, details).await;
    let q = Quota::resolve(&ctx.config.quotas, &merged, &ctx.config.limits);
    eprintln!(
        "{name}: {} sessions, {} runs, {} input tokens/day, {} CPU-seconds/day (0 = no limit); ceilings memory {} MB, {} CPUs, {} pids, workspace {} MB, tmp {} MB",
        q.sessions,
        q.runs,
        q.input_tokens_per_day,
        q.cpu_seconds_per_day,
        q.ceiling.memory_mb,
        q.ceiling.cpus,
        q.ceiling.pids,
        q.ceiling.workspace_mb,
        q.ceiling.tmp_mb
    );
    match &merged.egress {
        Some(e) => {
            eprintln!("{name}: egress at most {e} (and [egress] widest)");
            if let Err(m) = e.within(&ctx.config.egress.widest) {
                eprintln!(
                    "sandboxd: note: {m}: [egress] widest still applies, so {name}'s sessions get only what both allow"
                );
            }
        }
        None => eprintln!(
            "{name}: egress at most [egress] widest ({})",
            ctx.config.egress.widest
        ),
    }
    Ok(())
}

/// An audit entry by `cli` (the host's admin), bounded by the config's `[audit]`.
pub(super) async fn audit(
    ctx: &Ctx,
    store: &dyn Store,
    action: &str,
    target: &str,
    details: serde_json::Value,
) {
    let who = sandboxd_server::audit::Who::cli();
    sandboxd_server::audit::record_in(store, &ctx.config.audit, &who, action, target, details)
        .await;
}

/// Creates the user and prints their key, once; a name in use is refused.
async fn add(
    store: &dyn Store,
    name: &str,
    admin: bool,
    expires_in_days: Option<u32>,
    quota: &QuotaArgs,
) -> anyhow::Result<()> {
    match accounts::add(
        store,
        name,
        admin,
        expiry(expires_in_days),
        quota.to_override(),
    )
    .await
    {
        Ok((u, text)) => {
            eprintln!(
                "created {}user {} ({}); their API key follows, shown only now:",
                if admin { "admin " } else { "" },
                u.name,
                u.id
            );
            println!("{text}");
        }
        Err(AccountError::Exists(name)) => {
            bail!(
                "a user named {name:?} exists; `sandboxd users rotate {name}` gives them a new key"
            )
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Every user with their key's prefix, dates and sessions in use (never a key).
async fn list(ctx: &Ctx, store: &dyn Store) -> anyhow::Result<()> {
    println!(
        "{:<20} {:<6} {:<12} {:<17} {:<17} {:<17} sessions",
        "NAME", "ADMIN", "KEY", "CREATED", "LAST USED", "EXPIRES"
    );
    for u in store.users().await? {
        let q = Quota::resolve(&ctx.config.quotas, &u.quota, &ctx.config.limits);
        let usage = store.usage(&u.id, now_ms()).await?;
        println!(
            "{:<20} {:<6} {:<12} {:<17} {:<17} {:<17} {}/{}",
            u.name,
            if u.admin { "yes" } else { "no" },
            format!("{}…", u.key_prefix),
            when(Some(u.created_at)),
            when(u.last_used_at),
            when(u.expires_at),
            usage.active_sessions,
            q.sessions
        );
    }
    Ok(())
}

/// `users usage [NAME]`: the days of the report `GET /v1/usage` gives, as a table or CSV.
async fn usage(store: &dyn Store, name: Option<&str>, days: u32, csv: bool) -> anyhow::Result<()> {
    let owner = match name {
        None => None,
        Some(n) => match store.user_by_name(n).await? {
            Some(u) => Some(u.id),
            None => bail!("no user named {n:?} (see `sandboxd users list`)"),
        },
    };
    let report = sandboxd_server::usage::report(store, owner, days, now_ms()).await?;
    if csv {
        print!("{}", sandboxd_server::usage::csv_text(&report.days));
        return Ok(());
    }
    println!(
        "{:<10} {:<20} {:>10} {:>12} {:>10} {:>12} {:>12} {:>6} {:>10} {:>10}",
        "DAY",
        "USER",
        "CPU S",
        "MEM GIB·S",
        "WALL S",
        "BYTES IN",
        "BYTES OUT",
        "TOOLS",
        "TOK IN",
        "TOK OUT"
    );
    for d in &report.days {
        let u = &d.usage;
        let tin: u64 = u.tokens.iter().map(|t| t.tokens_in).sum();
        let tout: u64 = u.tokens.iter().map(|t| t.tokens_out).sum();
        println!(
            "{:<10} {:<20} {:>10.1} {:>12.1} {:>10.0} {:>12} {:>12} {:>6} {:>10} {:>10}",
            d.day,
            d.user,
            u.cpu_seconds,
            u.memory_gib_seconds,
            u.wall_seconds,
            u.bytes_in,
            u.bytes_out,
            u.tool_calls,
            tin,
            tout
        );
    }
    Ok(())
}
