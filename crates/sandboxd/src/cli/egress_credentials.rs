//! `sandboxd egress credentials list|set|remove --user NAME`: a user's own egress credentials
//! (the secrets the proxy adds for one host, sealed in the store with `[egress]
//! credential_key_file`), for the admin on the host. Like `sandboxd users` it works on the
//! store directly, also while the service runs, through the same calls as
//! `/v1/egress/credentials` (core's `egress::user_credentials`: the same checks, the same
//! sealing); a running serve applies a change to the user's sessions at its next upkeep
//! (`[sessions] reap_interval_secs`).
//!
//! The value is never an argument (argv is visible to every local user in `ps`): it is read
//! from standard input (piped; a terminal is refused rather than echoing what is typed) or
//! from the environment variable `--value-env` names, and it is never printed: a listing
//! shows hosts, headers and prefixes only.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;

use anyhow::{Context, bail};
use sandboxd_core::config::egress::{CredentialValue, EgressPolicy};
use sandboxd_core::egress::user_credentials::{self, NewCredential};
use sandboxd_core::store::{Store, User};
use serde_json::json;

use super::Ctx;
use super::users::audit;

/// The most bytes read from standard input for a value (a value has at most 8 KiB; the
/// rest is read only to say it is too long).
const MAX_STDIN: u64 = 64 << 10;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum EgressCommand {
    /// A user's own credentials: the secrets the proxy adds to their sessions' requests.
    #[command(subcommand)]
    Credentials(CredentialsCommand),
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum CredentialsCommand {
    /// The user's credentials: host, header, prefix (never the value).
    List {
        #[arg(long, value_name = "NAME")]
        user: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Attach a credential to one exact host (replacing the user's one for it). The value is
    /// read from standard input, or from the variable --value-env names; never from argv.
    Set {
        /// The exact destination host, e.g. api.github.com.
        host: String,
        #[arg(long, value_name = "NAME")]
        user: String,
        /// The header the proxy sets, e.g. Authorization.
        #[arg(long)]
        header: String,
        /// Written before the value, e.g. "Bearer ".
        #[arg(long, default_value = "")]
        prefix: String,
        /// Also add it to plain http:// requests (in cleartext); otherwise those are refused.
        #[arg(long)]
        allow_http: bool,
        /// Read the value from this environment variable instead of standard input.
        #[arg(long, value_name = "VAR")]
        value_env: Option<String>,
    },
    /// Remove the user's credential for a host.
    Remove {
        host: String,
        #[arg(long, value_name = "NAME")]
        user: String,
    },
}

pub(crate) async fn main(ctx: Ctx, cmd: EgressCommand) -> anyhow::Result<ExitCode> {
    let EgressCommand::Credentials(cmd) = cmd;
    let store = crate::backends::store(&ctx.config).await?;
    match cmd {
        CredentialsCommand::List { user, json } => {
            let u = user_named(store.as_ref(), &user).await?;
            let list = user_credentials::list(store.as_ref(), &u.id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<40} {:<24} {:<12} ALLOW_HTTP",
                    "HOST", "HEADER", "PREFIX"
                );
                for c in &list {
                    println!(
                        "{:<40} {:<24} {:<12} {}",
                        c.host,
                        c.header,
                        format!("{:?}", c.prefix),
                        c.allow_http
                    );
                }
            }
        }
        CredentialsCommand::Set {
            host,
            user,
            header,
            prefix,
            allow_http,
            value_env,
        } => {
            let u = user_named(store.as_ref(), &user).await?;
            let value = read_value(value_env.as_deref())?;
            let new = NewCredential {
                host,
                header,
                prefix,
                allow_http,
                value,
            };
            set(&ctx, store.as_ref(), &u, new).await?;
        }
        CredentialsCommand::Remove { host, user } => {
            let u = user_named(store.as_ref(), &user).await?;
            if !user_credentials::remove(store.as_ref(), &u.id, &host).await? {
                bail!(
                    "{user} has no egress credential for {host:?} (see `sandboxd egress credentials list --user {user}`)"
                );
            }
            let details = json!({"owner": u.id});
            audit(
                &ctx,
                store.as_ref(),
                "egress.credential.remove",
                &host,
                details,
            )
            .await;
            eprintln!(
                "removed {user}'s credential for {host}; a running serve stops adding it within [sessions] reap_interval_secs"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Attaches `new` to user `u` within their egress quota (or `[egress] widest`), as the API does.
async fn set(ctx: &Ctx, store: &dyn Store, u: &User, new: NewCredential) -> anyhow::Result<()> {
    let limit: EgressPolicy = u
        .quota
        .egress
        .clone()
        .unwrap_or_else(|| ctx.config.egress.widest.clone());
    let (info, replaced) =
        user_credentials::attach(store, &ctx.config.egress, &limit, &u.id, new).await?;
    let details = json!({"owner": u.id, "header": info.header, "allow_http": info.allow_http});
    audit(ctx, store, "egress.credential.put", &info.host, details).await;
    eprintln!(
        "{} {}'s credential for {} (header {}); a running serve applies it to their sessions within [sessions] reap_interval_secs",
        if replaced { "replaced" } else { "attached" },
        u.name,
        info.host,
        info.header
    );
    Ok(())
}

async fn user_named(store: &dyn Store, name: &str) -> anyhow::Result<User> {
    match store.user_by_name(name).await? {
        Some(u) => Ok(u),
        None => bail!("no user named {name:?} (see `sandboxd users list`)"),
    }
}

/// The value from `--value-env`'s variable, else from piped standard input (one trailing
/// line end dropped). Never echoed, never in an error message.
fn read_value(var: Option<&str>) -> anyhow::Result<CredentialValue> {
    let raw = match var {
        Some(name) => std::env::var(name).with_context(|| {
            format!("--value-env {name}: the variable is not set (or not UTF-8)")
        })?,
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!(
                    "the value is read from standard input, which is a terminal (it would be echoed): pipe it in (`sandboxd egress credentials set … < file`) or name a variable with --value-env"
                );
            }
            let mut text = String::new();
            stdin
                .lock()
                .take(MAX_STDIN)
                .read_to_string(&mut text)
                .context("reading the value from standard input (it must be UTF-8 text)")?;
            text
        }
    };
    let value = raw
        .strip_suffix("\r\n")
        .or_else(|| raw.strip_suffix('\n'))
        .unwrap_or(&raw);
    if value.is_empty() {
        bail!("the value is empty: give it on standard input or in the --value-env variable");
    }
    Ok(CredentialValue::new(value))
}
