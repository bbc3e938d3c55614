//! LazySandbox: a Sandbox whose container is created on first use and removed when the
//! owner (one MCP session) goes away. Listing tools never creates a container; the first
//! tool call does, through the front end's `Admission` (serve: the user's quota).
//!
//! Every call goes through `SessionManager::get`, which marks the session as used (so the
//! idle reaper only takes sessions nobody calls) and notices a session the reaper already
//! removed: the next call then gets a fresh container (admitted anew), and a warning is logged.
//! A sandbox that ended outside sandboxd (removed, evicted, OOM-killed: the manager's vanish
//! watch, `EndReason::Vanished`) took the client's files with it: the next call fails once,
//! saying so, and the one after starts a fresh container. Either way the admission is told
//! why the sandbox ended (`SessionManager::end_of`).
//!
//! Named by its MCP session (`session_for`), it first looks for the sandbox the front end
//! recorded for that session (`Admission::recorded`): serve's replicas restore a session
//! from the store wherever its next request lands, and the restored handler attaches the
//! same container rather than making another.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, Open, Ticket, attach_recorded, create_admitted};
use crate::sandbox::ends::EndReason;
use crate::sandbox::manager::Session;
use crate::sandbox::{
    AttachedProcess, DirEntry, ExecOutput, ExecRequest, FileStat, Owner, Sandbox, SandboxError,
    SessionManager, ShellOptions, ShellOutput, ShellStream, SpawnRequest,
};

/// The session a LazySandbox holds and the ticket it was admitted with.
struct Held {
    session: Arc<Session>,
    ticket: Ticket,
}

pub struct LazySandbox {
    manager: Arc<SessionManager>,
    owner: Owner,
    admission: Arc<dyn Admission>,
    session: tokio::sync::Mutex<Option<Held>>,
    first_id: OnceLock<String>,
    /// The MCP session this sandbox serves (its `Mcp-Session-Id`), once a call named it.
    key: OnceLock<String>,
    /// Where the removal on drop runs, so a server can wait for it before exiting.
    tracker: Option<TaskTracker>,
}

impl LazySandbox {
    pub fn new(manager: Arc<SessionManager>, owner: Owner) -> Arc<Self> {
        Self::make(manager, owner, Arc::new(Open), None)
    }

    /// Like `new`, with the removal on drop spawned on `tracker`.
    pub fn tracked(manager: Arc<SessionManager>, owner: Owner, tracker: TaskTracker) -> Arc<Self> {
        Self::make(manager, owner, Arc::new(Open), Some(tracker))
    }

    /// Like `tracked`, with every sandbox admitted (and its end reported) by `admission`.
    pub fn admitted(
        manager: Arc<SessionManager>,
        owner: Owner,
        tracker: TaskTracker,
        admission: Arc<dyn Admission>,
    ) -> Arc<Self> {
        Self::make(manager, owner, admission, Some(tracker))
    }

    fn make(
        manager: Arc<SessionManager>,
        owner: Owner,
        admission: Arc<dyn Admission>,
        tracker: Option<TaskTracker>,
    ) -> Arc<Self> {
        Arc::new(Self {
            manager,
            owner,
            admission,
            session: tokio::sync::Mutex::new(None),
            first_id: OnceLock::new(),
            key: OnceLock::new(),
            tracker,
        })
    }

    /// The live session, created now if there is none (or the reaper took it).
    pub async fn session(&self) -> Result<Arc<Session>, SandboxError> {
        self.session_for(None).await
    }

    /// Like `session`, for the MCP session `key` (its `Mcp-Session-Id`): with no sandbox
    /// held here, the one the front end recorded for `key` (made by another process that
    /// served the session) is attached if it is still there, and a sandbox held or made
    /// here is recorded for `key`.
    pub async fn session_for(&self, key: Option<&str>) -> Result<Arc<Session>, SandboxError> {
        Ok(self.session_admitted(key).await?.0)
    }

    /// `session_for`, and whether the sandbox was admitted just now (made for this call):
    /// the admission's check then already covered the call (`Admission::refusal`).
    pub async fn session_admitted(
        &self,
        key: Option<&str>,
    ) -> Result<(Arc<Session>, bool), SandboxError> {
        if let Some(k) = key {
            let _ = self.key.set(k.to_string());
        }
        let key = self.key.get().map(String::as_str);
        let mut slot = self.session.lock().await;
        let mut gone = None;
        if let Some(h) = slot.as_ref() {
            match self.manager.get(&self.owner, &h.session.id).await {
                Ok(s) => return Ok((s, false)),
                Err(e) => {
                    tracing::warn!(session = %h.session.id, error = %e, "the MCP session's sandbox is gone");
                    if let Some(g) = slot.take() {
                        let why = self.manager.end_of(&g.session.id);
                        self.admission
                            .ended(&g.ticket, &gone_reason(why.as_ref()))
                            .await;
                        // A sandbox that went outside sandboxd took the client's files
                        // with it: this call says so; the next one starts a new sandbox.
                        if let Some(EndReason::Vanished(kind)) = why {
                            return Err(SandboxError::SandboxGone {
                                session: g.session.id.clone(),
                                message: format!(
                                    "{kind}; its files are lost, and the next call starts a new, empty sandbox"
                                ),
                            });
                        }
                        gone = Some(g.session.id.clone());
                    }
                }
            }
        }
        let found = match key {
            Some(key) => self.recorded(key, gone.as_deref()).await,
            None => None,
        };
        let (s, ticket, admitted) = match found {
            Some((s, ticket)) => (s, ticket, false),
            None => {
                let (s, ticket) = create_admitted(
                    self.admission.clone(),
                    self.manager.clone(),
                    self.owner.clone(),
                )
                .await?;
                (s, ticket, true)
            }
        };
        if let Some(key) = key {
            self.admission.record(key, &ticket, &s).await;
        }
        let _ = self.first_id.set(s.id.clone());
        *slot = Some(Held {
            session: s.clone(),
            ticket,
        });
        Ok((s, admitted))
    }

    /// The sandbox recorded for `key`, attached, unless it is the one just found `gone`.
    async fn recorded(&self, key: &str, gone: Option<&str>) -> Option<(Arc<Session>, Ticket)> {
        let r = self.admission.recorded(key).await?;
        if gone == Some(r.session_id.as_str()) {
            return None;
        }
        match attach_recorded(&self.manager, &self.owner, &r).await {
            Ok(s) => Some((s, r.ticket)),
            Err(e) => {
                tracing::warn!(session = %r.session_id, error = %e, "the MCP session's recorded sandbox could not be attached; creating a new one");
                None
            }
        }
    }

    /// Removes the container now (session closed). Later calls would create a new one.
    pub async fn close(&self) {
        let taken = self.session.lock().await.take();
        if let Some(h) = taken {
            remove(&self.manager, &h.session).await;
            self.admission
                .ended(&h.ticket, "its MCP session was closed")
                .await;
        }
    }

    async fn sb(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Ok(self.session().await?.sandbox.clone())
    }

    async fn current(&self) -> Option<Arc<Session>> {
        self.session
            .lock()
            .await
            .as_ref()
            .map(|h| h.session.clone())
    }
}

impl Drop for LazySandbox {
    fn drop(&mut self) {
        let Some(held) = self.session.get_mut().take() else {
            return;
        };
        let manager = self.manager.clone();
        let admission = self.admission.clone();
        let key = self.key.get().cloned();
        let removal = async move {
            if let Some(key) = &key
                && !admission.release(key, &held.session.id).await
            {
                // Another process serves this MCP session with this sandbox now; it goes
                // when unused everywhere (the reapers), or when the client closes it.
                return;
            }
            remove(&manager, &held.session).await;
            admission
                .ended(&held.ticket, "its MCP session was closed")
                .await;
        };
        match (&self.tracker, tokio::runtime::Handle::try_current()) {
            (Some(tracker), Ok(rt)) => {
                tracker.spawn_on(removal, &rt);
            }
            (None, Ok(rt)) => {
                rt.spawn(removal);
            }
            // No runtime left (process exit): the startup reconciler removes the orphan
            // (and `serve`'s start ends its row).
            (_, Err(_)) => {
                tracing::warn!("no runtime to remove an MCP sandbox; it will be reconciled")
            }
        }
    }
}

/// What a front end records as the end of a sandbox that the manager no longer has: why it
/// ended, when the manager announced it lately (`SessionManager::end_of`).
pub(super) fn gone_reason(why: Option<&EndReason>) -> String {
    match why {
        Some(why) => why.to_string(),
        None => "its sandbox was removed (idle, or over the memory budget)".to_string(),
    }
}

/// Removes the session; one the reaper already took is not an error.
async fn remove(manager: &SessionManager, session: &Session) {
    match manager.remove(&session.owner, &session.id).await {
        Ok(()) | Err(SandboxError::SessionNotFound { .. }) => {}
        Err(e) => {
            tracing::warn!(session = %session.id, error = %e, "could not remove the MCP session's sandbox")
        }
    }
}

#[async_trait]
impl Sandbox for LazySandbox {
    fn session_id(&self) -> &str {
        self.first_id.get().map(String::as_str).unwrap_or("")
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        self.sb().await?.exec(req).await
    }

    async fn spawn(&self, req: SpawnRequest) -> Result<AttachedProcess, SandboxError> {
        self.sb().await?.spawn(req).await
    }

    async fn shell(&self, command: &str, opts: ShellOptions) -> Result<ShellOutput, SandboxError> {
        self.sb().await?.shell(command, opts).await
    }

    async fn shell_stream(
        &self,
        command: &str,
        opts: ShellOptions,
        to: ShellStream,
    ) -> Result<ShellOutput, SandboxError> {
        self.sb().await?.shell_stream(command, opts, to).await
    }

    async fn restart_shell(&self) -> Result<(), SandboxError> {
        self.sb().await?.restart_shell().await
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.sb().await?.read_file(path).await
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        self.sb().await?.write_file(path, data).await
    }

    async fn read_head(&self, path: &str, max: usize) -> Result<(Vec<u8>, u64), SandboxError> {
        self.sb().await?.read_head(path, max).await
    }

    async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        self.sb().await?.list_dir(path).await
    }

    async fn stat(&self, path: &str) -> Result<FileStat, SandboxError> {
        self.sb().await?.stat(path).await
    }

    async fn mkdir(&self, path: &str) -> Result<(), SandboxError> {
        self.sb().await?.mkdir(path).await
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError> {
        self.sb().await?.remove(path, recursive).await
    }

    async fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<(), SandboxError> {
        self.sb().await?.upload_tar(dir, archive).await
    }

    async fn download_tar(&self, dir: &str) -> Result<Vec<u8>, SandboxError> {
        self.sb().await?.download_tar(dir).await
    }

    async fn kill_tagged(&self, tag: &str) -> Result<(), SandboxError> {
        self.sb().await?.kill_tagged(tag).await
    }

    async fn is_alive(&self) -> bool {
        match self.current().await {
            Some(s) => s.sandbox.is_alive().await,
            None => false,
        }
    }

    async fn check_alive(&self) -> Result<(), SandboxError> {
        match self.current().await {
            Some(s) => s.sandbox.check_alive().await,
            None => Err(SandboxError::SandboxGone {
                session: self.session_id().to_string(),
                message: "it was never started".into(),
            }),
        }
    }
}
