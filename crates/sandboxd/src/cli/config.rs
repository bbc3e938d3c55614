//! `sandboxd config import-openmanus`: OpenManus's `config.toml` (and `mcp.json`) turned into
//! sandboxd's, with a key-by-key report. The mapping is the library's
//! (`sandboxd_core::config::openmanus`); this shell reads, prints and writes.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use sandboxd_core::config::openmanus::{self, Outcome};
use sandboxd_core::mcp::config::{self as mcp_config, Transport};

use super::Ctx;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Convert OpenManus's config.toml (and mcp.json) into sandboxd.toml (and mcp.json),
    /// printing what was mapped where and what was dropped and why.
    ImportOpenmanus {
        /// OpenManus's config.toml.
        #[arg(value_name = "CONFIG")]
        openmanus_config: PathBuf,
        /// OpenManus's mcp.json, accepted as it is ("type": stdio, sse, streamable-http).
        mcp: Option<PathBuf>,
        /// The directory to write sandboxd.toml (and mcp.json) into.
        #[arg(long, default_value = "config")]
        out_dir: PathBuf,
        /// Replace files that exist already.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) async fn main(_ctx: Ctx, cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let ConfigCommand::ImportOpenmanus {
        openmanus_config: config,
        mcp,
        out_dir,
        force,
    } = cmd;
    let toml_out = out_dir.join("sandboxd.toml");
    let mcp_out = out_dir.join("mcp.json");
    let mut targets = vec![&toml_out];
    if mcp.is_some() {
        targets.push(&mcp_out);
    }
    if let Some(existing) = targets.iter().find(|p| p.exists())
        && !force
    {
        bail!(
            "{} exists already; nothing was written (pass --force to replace it, or --out-dir)",
            existing.display()
        );
    }
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let mcp_text = match &mcp {
        Some(p) => Some(
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        ),
        None => None,
    };
    let mcp_path = mcp.as_ref().map(|_| mcp_out.display().to_string());
    let imported = openmanus::import(&text, mcp_path.as_deref())
        .with_context(|| format!("cannot import {}", config.display()))?;

    println!("{}:", config.display());
    let (mut mapped, mut dropped) = (0, 0);
    for line in &imported.report {
        match &line.outcome {
            Outcome::Mapped { to, note } => {
                mapped += 1;
                let note = note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
                println!("  mapped   {} → {to}{note}", line.key);
            }
            Outcome::Dropped { reason } => {
                dropped += 1;
                println!("  dropped  {}: {reason}", line.key);
            }
        }
    }
    if let (Some(p), Some(t)) = (&mcp, &mcp_text) {
        report_mcp(p, t)?;
    }

    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    write_private(&toml_out, imported.toml.as_bytes())?;
    println!(
        "wrote {} ({mapped} keys mapped, {dropped} dropped; every other key keeps its default)",
        toml_out.display()
    );
    if let Some(t) = &mcp_text {
        write_private(&mcp_out, t.as_bytes())?;
        println!("wrote {} (unchanged)", mcp_out.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per MCP server: how sandboxd will reach it, or why it will not start.
fn report_mcp(path: &Path, text: &str) -> anyhow::Result<()> {
    let (good, bad) = mcp_config::parse(text)
        .map_err(|m| anyhow::anyhow!("{} is not a valid MCP server list: {m}", path.display()))?;
    println!("{}:", path.display());
    for s in &good {
        let how = match &s.transport {
            Transport::Stdio { command, .. } => format!("stdio, runs {command:?} on this host"),
            Transport::Http { url, .. } => format!("streamable HTTP at {url}"),
            Transport::Sse { url, .. } => format!("legacy SSE at {url}"),
        };
        println!("  server   {}: {how}", s.name);
    }
    for e in &bad {
        println!("  refused  {e}");
    }
    Ok(())
}

/// Writes a file readable by its owner only (it may hold an API key), whole or not at all.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("import-tmp");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}
