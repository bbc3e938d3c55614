//! The MCP server: the agent's own sandbox tools, served to any MCP client.
//!
//! Names, descriptions and schemas come straight from the `ToolRegistry` that
//! `session_registry` builds (the same tools the agent uses); a call runs on the session's
//! own tools, `SessionTools::server_registry` (so the MCP client and the agent share one
//! python interpreter, browser and undo history per session), through
//! `ToolRegistry::execute`, so arguments are validated exactly as for the model.
//!
//! # One sandbox per client
//!
//! * **stdio, and HTTP clients with a session** (every protocol before 2026-07-28, which
//!   is what rmcp's, the Python SDK's and most clients' `initialize` handshake selects):
//!   rmcp builds one `SandboxServer` per connection/`Mcp-Session-Id`. It owns a
//!   `LazySandbox`, so the container is created on the first tool call (listing tools
//!   costs nothing) and removed when the handler is dropped: the client closed the session
//!   (HTTP DELETE, stdin EOF) or rmcp's keep-alive ended one on which nothing passed
//!   (`session_keep_alive`: the idle timeout plus the longest tool call, since a call in
//!   flight sends nothing). The SessionManager's reaper removes the container of a session
//!   idle for `[sessions] idle_timeout_secs` (never one with a call in flight); the next
//!   call makes a new one.
//!
//! * **stateless clients** (protocol 2026-07-28: no session, a fresh handler for every
//!   request): nothing on the connection can carry a sandbox, so the client holds it
//!   explicitly. `tools/list` then also offers `sandbox_create` (returns an opaque
//!   128-bit id) and `sandbox_close`, and every sandbox tool takes a required `sandbox_id`.
//!   The session is owned by the SHA-256 of the bearer token that created it (on `serve`,
//!   `ServerState::for_user`: by the user, like their sessions): a request with another
//!   token cannot use or close it (with a single shared token the id itself is the
//!   capability, which is why it is long and random), and one owner holds at most
//!   `[sessions] max_per_owner` of them.
//!
//! Every sandbox is made through the server's `Admission` (admission.rs): `sandboxd mcp`
//! admits all with the admin's limits; `serve` reserves a session of the user's quota first,
//! with their ceilings, and a full quota is a tool error that says how to free a place. They are sessions of the one SessionManager, so
//!   its one reaper removes those unused for `idle_timeout_secs` (see stateless.rs).
//!
//! Images in a result become MCP image content; model-actionable failures and sandboxd's
//! own failures both come back as tool errors (`isError: true`) with readable text.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, Open};
use super::lazy::LazySandbox;
use super::stateless::{StatelessSandboxes, create_refusal, token_owner};
pub use super::wire::to_call_result;
use super::wire::{error_result, lifecycle_tools, to_mcp_tool, with_sandbox_id};
use crate::config::Config;
use crate::sandbox::manager::Session;
use crate::sandbox::{Owner, Sandbox, SessionManager};
use crate::tools::session::SessionTools;
use crate::tools::{ToolContext, ToolRegistry, ToolSpec};

/// The tools of a sandbox no session state is kept for (the specs, tests): the same
/// sandbox tools the agent gets, plus file access. Calls of a live session go through
/// `SessionTools::server_registry` instead.
pub fn session_registry(sandbox: Arc<dyn Sandbox>, config: &Config) -> ToolRegistry {
    crate::tools::session::server_tools(sandbox, &config.limits, config)
}

/// What the server tells clients about the sandbox.
pub fn instructions(config: &Config) -> String {
    let l = &config.limits;
    format!(
        "sandboxd runs every tool inside a hardened Docker container: Debian with bash and python3, \
         NO network access, a read-only root filesystem, uid 1000 without capabilities. Work in \
         /workspace ({} MB) and /tmp ({} MB); nothing else is writable. Limits: {} MB memory, {} CPU, \
         {} processes, {} s per command, {} KB of output per stream (longer output is cut in the \
         middle), {} MB per file read or write. Each MCP session gets its own container, created on \
         its first tool call and removed when the session closes or has been idle for {} s; files \
         do not survive it. Stateless (2026-07-28) clients call sandbox_create first and pass the \
         returned sandbox_id to every tool.{}",
        l.workspace_mb,
        l.tmp_mb,
        l.memory_mb,
        l.cpus,
        l.pids,
        l.max_timeout_secs,
        l.output_cap_kb,
        l.max_file_mb,
        config.sessions.idle_timeout_secs,
        if config.research.enabled && config.research.mcp {
            " web_search and web_fetch run on the sandboxd host (not in the container) and save \
             what they find under /workspace/research; private and local addresses are refused."
        } else {
            ""
        },
    )
}

/// State shared by every handler of one server.
pub struct ServerState {
    pub manager: Arc<SessionManager>,
    pub config: Config,
    /// The owner of the sessions of clients with a session (`mcp-stdio`, `mcp-http`);
    /// stateless clients' sessions are owned by their token, unless `owns_stateless`.
    pub owner: Owner,
    /// Stateless sandboxes are owned by `owner` too (serve: one server per user, whose
    /// sandboxes are theirs whatever the protocol), not by the request's token.
    owns_stateless: bool,
    /// The front end's rules for every sandbox made here (serve: the user's quota).
    pub admission: Arc<dyn Admission>,
    specs: Vec<ToolSpec>,
    instructions: String,
    pub stateless: StatelessSandboxes,
    /// Container removals of dropped sessions; `shutdown` waits for them.
    removals: TaskTracker,
}

impl ServerState {
    /// A server of its own (`sandboxd mcp`): sandboxes with the admin's limits, stateless
    /// ones owned by their token.
    pub fn new(manager: Arc<SessionManager>, config: Config, owner: Owner) -> Arc<Self> {
        Self::make(manager, config, owner, Arc::new(Open), false)
    }

    /// The server of one user of a front end (`serve`): every sandbox, stateless ones
    /// too, is owned by `owner` and admitted by `admission`.
    pub fn for_user(
        manager: Arc<SessionManager>,
        config: Config,
        owner: Owner,
        admission: Arc<dyn Admission>,
    ) -> Arc<Self> {
        Self::make(manager, config, owner, admission, true)
    }

    fn make(
        manager: Arc<SessionManager>,
        config: Config,
        owner: Owner,
        admission: Arc<dyn Admission>,
        owns_stateless: bool,
    ) -> Arc<Self> {
        // Specs do not depend on the sandbox: build them once over a sandbox never used.
        let probe = LazySandbox::new(manager.clone(), owner.clone());
        let specs = session_registry(probe, &config).specs();
        let instructions = instructions(&config);
        Arc::new(Self {
            manager,
            owner,
            owns_stateless,
            admission,
            specs,
            instructions,
            stateless: StatelessSandboxes::default(),
            removals: TaskTracker::new(),
            config,
        })
    }

    /// Removes every sandbox of this server and waits for removals already under way.
    pub async fn shutdown(&self) {
        self.stateless.clear().await;
        self.removals.close();
        if tokio::time::timeout(Duration::from_secs(60), self.removals.wait())
            .await
            .is_err()
        {
            tracing::warn!("sandbox removals did not finish within 60 s");
        }
        self.manager.remove_all().await;
    }

    fn new_slot(&self) -> Slot {
        let sandbox = LazySandbox::admitted(
            self.manager.clone(),
            self.owner.clone(),
            self.removals.clone(),
            self.admission.clone(),
        );
        Slot { sandbox }
    }

    /// The request came over HTTP without a session: a stateless (2026-07-28) client, owned
    /// by its token, or by this server's owner when it owns every sandbox it makes.
    fn stateless_owner(&self, ctx: &RequestContext<RoleServer>) -> Option<Owner> {
        let parts = ctx.extensions.get::<http::request::Parts>()?;
        if parts.headers.contains_key("mcp-session-id") {
            return None;
        }
        if self.owns_stateless {
            return Some(self.owner.clone());
        }
        // Set by the bearer check from the verified token (never from the raw header, whose
        // spelling a client controls); without auth every stateless client is the same one.
        let client = parts.extensions.get::<VerifiedClient>();
        Some(token_owner(client.map(|c| &c.0[..]).unwrap_or_default()))
    }
}

/// The `Mcp-Session-Id` a request came with (HTTP clients with a session).
fn mcp_session_id(ctx: &RequestContext<RoleServer>) -> Option<String> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    let id = parts.headers.get("mcp-session-id")?.to_str().ok()?;
    Some(id.to_string())
}

/// Who a request is (set in the request's extensions by the HTTP transport's bearer check), once its bearer token is verified: a digest of the token itself, never of
/// the raw header (`Bearer T`, `bearer T` and `Bearer  T` are one client, not three, so the
/// per-client sandbox cap cannot be multiplied by spelling the header differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifiedClient(pub [u8; 32]);

/// The sandbox of one MCP session. Its tools are the session's own
/// (`SessionTools::server_registry`), looked up at each call, since the sandbox is created
/// on the first call and replaced if the reaper took it.
pub struct Slot {
    pub sandbox: Arc<LazySandbox>,
}

/// The handler rmcp runs: one per stdio connection or HTTP session, or one per stateless request.
pub struct SandboxServer {
    state: Arc<ServerState>,
    slot: Arc<Slot>,
}

impl SandboxServer {
    pub fn new(state: Arc<ServerState>) -> Self {
        let slot = Arc::new(state.new_slot());
        Self { state, slot }
    }

    /// Removes this connection's container now (stdio EOF) instead of on drop.
    pub async fn close(&self) {
        self.slot.sandbox.close().await;
    }

    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }
}

async fn run(
    registry: &ToolRegistry,
    name: &str,
    args: JsonObject,
    ctx: &RequestContext<RoleServer>,
) -> CallToolResponse {
    let raw = Value::Object(args).to_string();
    let tctx = ToolContext {
        cancel: ctx.ct.clone(),
    };
    match registry.execute(name, &raw, &tctx).await {
        Ok(r) => to_call_result(&r).into(),
        Err(e) => error_result(format!("sandboxd could not run {name}: {e}")),
    }
}

/// `run` in a sandbox, unless the admission refuses it (its error is the tool's; not asked
/// when the sandbox was `admitted` for this very call, whose `admit` made the same check):
/// not idle while the call lasts (it may outlast the idle timeout), and counted by the
/// admission once it ran (usage metering).
async fn run_in(
    admission: &dyn Admission,
    admitted: bool,
    session: &Session,
    registry: &ToolRegistry,
    name: &str,
    args: JsonObject,
    ctx: &RequestContext<RoleServer>,
) -> CallToolResponse {
    if !admitted && let Some(why) = admission.refusal(session).await {
        return error_result(why);
    }
    let _in_use = session.hold();
    let result = run(registry, name, args, ctx).await;
    admission.tool_called(session).await;
    result
}

impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(self.state.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = if self.state.stateless_owner(&ctx).is_some() {
            let mut t = lifecycle_tools();
            t.extend(self.state.specs.iter().map(with_sandbox_id));
            t
        } else {
            self.state.specs.iter().map(to_mcp_tool).collect()
        };
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let mut args = request.arguments.unwrap_or_default();
        let Some(owner) = self.state.stateless_owner(&ctx) else {
            if !self.state.specs.iter().any(|s| s.name == name) {
                // Answered without creating a container for it.
                return Ok(run(&ToolRegistry::new(), &name, args, &ctx).await);
            }
            let key = mcp_session_id(&ctx);
            return Ok(
                match self.slot.sandbox.session_admitted(key.as_deref()).await {
                    Ok((session, admitted)) => {
                        let registry = SessionTools::server_registry(&session, &self.state.config);
                        let admission = self.state.admission.as_ref();
                        run_in(admission, admitted, &session, &registry, &name, args, &ctx).await
                    }
                    Err(e) => error_result(format!("sandboxd could not run {name}: {e}")),
                },
            );
        };
        let (stateless, manager) = (&self.state.stateless, &self.state.manager);
        let admission = &self.state.admission;
        if name == "sandbox_create" {
            // The manager's per-owner cap keeps one client from taking every session (and
            // serve's admission holds a user to their quota).
            return Ok(
                match stateless
                    .create(manager, &self.state.config, &owner, admission)
                    .await
                {
                    Ok(id) => CallToolResult::success(vec![ContentBlock::text(format!(
                        "sandbox_id: {id}\nPass it as sandbox_id to every tool; call sandbox_close when done."
                    ))])
                    .into(),
                    Err(e) => error_result(create_refusal(&e)),
                },
            );
        }
        let id = match args.remove("sandbox_id") {
            Some(Value::String(id)) => id,
            _ => {
                return Ok(error_result(
                    "this is a stateless session: call sandbox_create first and pass its sandbox_id",
                ));
            }
        };
        if name == "sandbox_close" {
            return Ok(
                match stateless
                    .close(manager, &owner, &id, admission.as_ref())
                    .await
                {
                    true => CallToolResult::success(vec![ContentBlock::text(format!(
                        "sandbox {id} removed"
                    ))])
                    .into(),
                    false => error_result(format!(
                        "no sandbox {id:?} (it was closed, idled out, or belongs to another token)"
                    )),
                },
            );
        }
        match stateless
            .get(manager, &self.state.config, &owner, &id, admission.as_ref())
            .await
        {
            Some((session, registry)) => {
                let admission = admission.as_ref();
                Ok(run_in(admission, false, &session, &registry, &name, args, &ctx).await)
            }
            None => Ok(error_result(format!(
                "no sandbox {id:?} (it was closed, idled out, or belongs to another token); call sandbox_create"
            ))),
        }
    }
}
