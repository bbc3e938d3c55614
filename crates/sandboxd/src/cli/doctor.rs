//! `sandboxd doctor`: is everything in place? Each check says what to do when it fails.

use std::process::ExitCode;

use std::sync::Arc;

use sandboxd_core::config::{BackendKind, LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::{CreateOptions, Owner, SandboxError, SessionManager, ShellOptions};
use sandboxd_docker::{self as docker, image as docker_image};

use super::Ctx;

pub(crate) async fn main(ctx: Ctx) -> anyhow::Result<ExitCode> {
    let mut failures = 0;
    let mut check = |ok: bool, what: String, fix: &str| {
        if ok {
            println!("  ok    {what}");
        } else {
            failures += 1;
            println!("  FAIL  {what}\n        → {fix}");
        }
    };
    println!("sandboxd {}", env!("CARGO_PKG_VERSION"));
    let l = &ctx.config.limits;
    let limits = format!(
        "  info  limits per session: {} MiB memory (no swap), {} CPU, {} processes, /workspace {} MiB, /tmp {} MiB, commands ≤ {} s",
        l.memory_mb, l.cpus, l.pids, l.workspace_mb, l.tmp_mb, l.max_timeout_secs
    );
    if ctx.config.runtime.kind() == BackendKind::Kubernetes {
        println!("{limits}");
        println!(
            "  info  hardening: one pod per session, restricted Pod Security, read-only root, uid 1000, all capabilities dropped, no privilege escalation, RuntimeDefault seccomp, no service account token, a deny-all NetworkPolicy"
        );
        kubernetes(&ctx, &mut check).await;
    } else {
        let engine = docker::connect().await;
        engine_and_image(&engine, &mut check).await;
        println!("{limits}");
        println!(
            "  info  hardening: network none, read-only root, uid 1000, all capabilities dropped, no-new-privileges, default seccomp"
        );
        oci_runtimes(&ctx, &engine, &mut check).await;
    }
    match sandboxd_core::llm::LlmClient::from_config(&ctx.config.llm) {
        Ok(client) => check(
            true,
            format!("LLM configured: model {}", client.model()),
            "",
        ),
        Err(e) => check(false, "LLM not configured".into(), &format!("{e}")),
    }
    research(&ctx.config.research, &mut check).await;
    mcp_servers(&ctx.config.mcp.servers_file);
    match crate::backends::check_store(&ctx.config).await {
        Ok(what) => check(true, what, ""),
        Err(what) => check(
            false,
            what,
            "start the database or correct [store] url (SANDBOXD_STORE_URL); empty means the SQLite file in the data directory",
        ),
    }
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `[runtime] backend = "kubernetes"`: the cluster's checks (the kubernetes crate's
/// doctor.rs: API server, namespace and admission, RBAC, image, the network probe).
async fn kubernetes(ctx: &Ctx, check: &mut impl FnMut(bool, String, &str)) {
    use sandboxd_kubernetes::doctor::{Level, checks};
    let rt = match crate::backends::kube_runtime(&ctx.config).await {
        Ok(rt) => rt,
        Err(e) => {
            return check(
                false,
                format!("Kubernetes: {e:#}"),
                "point KUBECONFIG at the cluster (or run in it with its service account)",
            );
        }
    };
    for c in checks(&rt).await {
        match c.level {
            Level::Ok => check(true, c.what, ""),
            Level::Fail => check(false, c.what, &c.fix),
            Level::Info => println!("  info  {}", c.what),
            Level::Warn => println!("  warn  {}\n        → {}", c.what, c.fix),
        }
    }
}

/// The Docker engine, the sandbox image in it, and mmdebstrap to build the image.
async fn engine_and_image(
    engine: &Result<docker::Engine, SandboxError>,
    check: &mut impl FnMut(bool, String, &str),
) {
    const FIX: &str = "install and start Docker (apt-get install docker.io && systemctl start docker), or set DOCKER_HOST";
    // The version is a request of its own: an engine that answered the connect may still
    // refuse the next one (a TLS front that breaks resumed sessions does).
    let version = match engine {
        Ok(e) => {
            let rt = docker::DockerRuntime::new(e.clone(), String::new(), None);
            rt.engine_version().await.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    match version {
        Ok(v) => check(true, format!("Docker engine reachable: {v}"), ""),
        Err(e) => check(false, format!("Docker engine: {e}"), FIX),
    }
    if let Ok(e) = engine {
        let tag = docker_image::image_tag();
        let present = docker_image::image_present(e).await.unwrap_or(false);
        check(
            present,
            format!("sandbox image {tag}"),
            "run `sandboxd image build` (needs mmdebstrap: apt-get install mmdebstrap)",
        );
    }
    let mmdebstrap = std::process::Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_ok();
    check(
        mmdebstrap,
        "mmdebstrap available (needed only to build the image)".into(),
        "apt-get install mmdebstrap",
    );
}

/// The OCI runtimes Docker has, whether gVisor really runs a session here, and whether the
/// configured runtime ([docker] runtime) is registered.
async fn oci_runtimes(
    ctx: &Ctx,
    engine: &Result<docker::Engine, SandboxError>,
    check: &mut impl FnMut(bool, String, &str),
) {
    let runtime = &ctx.config.docker.runtime;
    let registered = match engine {
        Ok(e) => docker::DockerRuntime::new(e.clone(), String::new(), None)
            .registered_runtimes()
            .await
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let has_runsc = registered.iter().any(|r| r == "runsc");
    println!(
        "  info  OCI runtimes registered with Docker: {}; gVisor (runsc) {}",
        if registered.is_empty() {
            "unknown".to_string()
        } else {
            registered.join(", ")
        },
        if has_runsc {
            "available: set [docker] runtime = \"runsc\" for the stronger tier"
        } else {
            "not available (scripts/gvisor.sh installs runsc and registers it with Docker without a restart)"
        }
    );
    // Registered is not working: Debian's runsc refuses to start on some kernels. One real
    // session under it says which, in the engine's words.
    if has_runsc && let Ok(e) = engine {
        let image = if ctx.config.docker.image.is_empty() {
            docker_image::image_tag()
        } else {
            ctx.config.docker.image.clone()
        };
        match probe_runtime(e, image, "runsc", &ctx.config.limits).await {
            Ok(()) => println!(
                "  info  gVisor (runsc) ran a session here. Known gaps (README: Stronger isolation): a command over the memory or process limit ends the whole session, exec'd processes get no Docker seccomp profile; an older runsc than scripts/gvisor.sh installs also breaks ls/stat"
            ),
            Err(err) => check(
                runtime != "runsc",
                format!("gVisor (runsc) cannot run a session here: {err}"),
                "register it with scripts/gvisor.sh (it adds --network=none, needed on Linux >= 6.11), or set [docker] runtime = \"\"",
            ),
        }
    }
    if runtime.is_empty() {
        println!("  info  OCI runtime: Docker's default (runc)");
    } else {
        check(
            registered.iter().any(|r| r == runtime),
            format!("OCI runtime {runtime} ([docker] runtime) registered with Docker"),
            "install and register it with Docker (see README: Stronger isolation), or set [docker] runtime = \"\"",
        );
    }
}

/// Research: off, or web_fetch on and which engines answer. One engine that does not
/// answer is a warning; none answering means web_search cannot work, a failure.
async fn research(
    config: &sandboxd_core::research::ResearchConfig,
    check: &mut impl FnMut(bool, String, &str),
) {
    use sandboxd_core::research::probe::{EngineState, probe_engines};
    if !config.enabled {
        println!("  info  research: off ([research] enabled = false): no web_search, no web_fetch");
        return;
    }
    let allow = if config.allow.is_empty() {
        "no private addresses allowed".to_string()
    } else {
        format!("allow-list {:?}", config.allow)
    };
    println!(
        "  info  research: web_fetch on (ports {:?}, {allow}); MCP server {}",
        config.ports,
        if config.mcp {
            "offers them"
        } else {
            "does not offer them ([research] mcp = false)"
        }
    );
    let mut answering = 0;
    for (name, state) in probe_engines(config).await {
        match state {
            EngineState::Answers(n) => {
                answering += 1;
                check(
                    true,
                    format!("search engine {name} answers ({n} results)"),
                    "",
                );
            }
            EngineState::Fails(why) => println!(
                "  warn  search engine {name} does not answer: {why}\n        → check the endpoint, or drop it from [research] engines"
            ),
            EngineState::Unconfigured(why) => {
                println!("  info  search engine {name} not configured: {why}")
            }
        }
    }
    check(
        answering > 0,
        format!("web_search: {answering} engine(s) answer"),
        "configure a SearXNG instance ([research] searxng_url) or a Brave/Tavily key, or check the network",
    );
}

/// Creates one session under the OCI runtime `name`, has its shell answer and removes it.
async fn probe_runtime(
    engine: &docker::Engine,
    image: String,
    name: &str,
    limits: &Limits,
) -> Result<(), String> {
    let rt = docker::DockerRuntime::new(engine.clone(), image, Some(name.into()));
    let m = SessionManager::new(
        Arc::new(rt),
        limits.clone(),
        SessionsConfig::default(),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let owner = Owner::new("doctor").map_err(|e| e.to_string())?;
    let s = m
        .create(&owner, &LimitRequest::default(), CreateOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let out = s.sandbox.shell("true", ShellOptions::default()).await;
    let _ = m.remove(&owner, &s.id).await;
    match out {
        Ok(o) if o.exit_code == Some(0) => Ok(()),
        Ok(o) => Err(format!("the first command exited with {:?}", o.exit_code)),
        Err(e) => Err(e.to_string()),
    }
}

/// The MCP server list of `[mcp] servers_file`: where each stdio server runs; one that runs on
/// the host (`"host": true`) is a warning, since it has the host's network and files.
fn mcp_servers(file: &str) {
    use sandboxd_core::mcp::config::{self as mcp_config, Transport};
    if file.is_empty() {
        return;
    }
    let (servers, bad) = match mcp_config::load(std::path::Path::new(file)) {
        Ok(parsed) => parsed,
        Err(e) => {
            println!("  warn  MCP servers: {e}");
            return;
        }
    };
    for s in servers {
        match s.transport {
            Transport::Stdio {
                host: true,
                command,
                ..
            } => println!(
                "  warn  MCP server {} runs {command:?} on this host, outside the sandbox (\"host\": true)\n        → \
                 drop \"host\" to run it inside each session's sandbox, if its code is in the image or /workspace",
                s.name
            ),
            Transport::Stdio { command, .. } => println!(
                "  info  MCP server {}: {command:?} runs inside each session's sandbox",
                s.name
            ),
            Transport::Http { url, .. } | Transport::Sse { url, .. } => {
                println!("  info  MCP server {}: {url}", s.name)
            }
        }
    }
    for e in bad {
        println!("  warn  {e}");
    }
}
