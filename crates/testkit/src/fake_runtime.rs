//! A fake runtime: sandboxes as in-memory records, no Docker, so the session manager's
//! logic that depends on time (caps under concurrent creates, the idle reaper) and on other
//! processes (the reconciler) is tested in milliseconds under `tokio::time::pause()`.
//!
//! Its sandboxes are the real `ExecSandbox` over `FakeExec`, a backend that implements only
//! what the seam asks of a second backend (spawn and liveness): every process it starts
//! exits at once with status 0 and no output. `FakeSandbox` wraps it to count warm-ups
//! (the real one starts a shell, which the fake cannot speak). The fake also records the
//! limits updates a claim asks for and the image revision each sandbox was made from.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxMeta, SandboxSpec};
use sandboxd_core::sandbox::vanished::{REPORTS_BUFFERED, VanishKind, Vanished};
use sandboxd_core::sandbox::{
    AttachedProcess, DirEntry, ExecOutput, ExecRequest, FileStat, Owner, Sandbox, SandboxError,
    SandboxState, ShellOptions, ShellOutput, ShellStream, SpawnRequest,
};

/// The creator this "process" records; the fake treats it as alive unless told otherwise.
pub const ME: &str = "fake:me";

#[derive(Default)]
struct State {
    /// By handle.
    sandboxes: HashMap<String, FoundSandbox>,
    next: u64,
    creates: usize,
    /// Every handle ever made (a handle is never reused).
    made: Vec<String>,
    /// The image revision each sandbox was made from, by handle.
    revision_of: HashMap<String, String>,
    /// Limits updates applied, by handle.
    updates: Vec<(String, Limits)>,
    warm_ups: usize,
    /// Every `kill_tagged` asked of a sandbox: (handle, tag).
    kills: Vec<(String, String)>,
    /// Every `mark_claimed`: (handle, owner).
    claims: Vec<(String, String)>,
    /// How many processes were started.
    spawns: usize,
}

#[derive(Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    alive: Mutex<HashSet<String>>,
    /// How long a create takes (virtual time under pause).
    create_delay: Mutex<Duration>,
    /// What `image_revision` answers; new sandboxes record it.
    revision: Mutex<String>,
    /// Whether `update_limits` accepts (true) or declines.
    updates_accepted: Mutex<bool>,
    /// Whether `mark_claimed` fails.
    claims_fail: Mutex<bool>,
    /// What `memory_usage` answers for every sandbox (None: the backend cannot tell).
    memory_each: Mutex<Option<u64>>,
    /// Where `vanish` reports (made on first use).
    reports: std::sync::OnceLock<tokio::sync::broadcast::Sender<Vanished>>,
    /// Whether processes hang until their sandbox is gone (see `hang_processes`).
    hang: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeRuntime {
    pub fn new() -> Arc<FakeRuntime> {
        let rt = FakeRuntime::default();
        rt.set_alive(ME, true);
        rt.set_revision("image-1");
        rt.accept_updates(true);
        Arc::new(rt)
    }

    /// What new sandboxes are made from from now on.
    pub fn set_revision(&self, revision: &str) {
        *self.revision.lock().unwrap() = revision.into();
    }

    /// Every sandbox uses this much memory from now on.
    pub fn set_memory_each(&self, bytes: u64) {
        *self.memory_each.lock().unwrap() = Some(bytes);
    }

    pub fn accept_updates(&self, yes: bool) {
        *self.updates_accepted.lock().unwrap() = yes;
    }

    /// Makes `mark_claimed` fail (as a patch the API server refuses would).
    pub fn fail_claims(&self, yes: bool) {
        *self.claims_fail.lock().unwrap() = yes;
    }

    /// Claims marked so far: (handle, owner).
    pub fn claims(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().claims.clone()
    }

    /// The handles of every sandbox that exists, sorted.
    pub fn handles(&self) -> Vec<String> {
        let mut h: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .sandboxes
            .keys()
            .cloned()
            .collect();
        h.sort();
        h
    }

    /// Every handle ever made, in order.
    pub fn made(&self) -> Vec<String> {
        self.state.lock().unwrap().made.clone()
    }

    /// The sandboxes that exist with the image revision they were made from.
    pub fn revisions(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        let mut r: Vec<String> = st
            .sandboxes
            .keys()
            .map(|h| st.revision_of.get(h).cloned().unwrap_or_default())
            .collect();
        r.sort();
        r
    }

    /// The sandboxes that exist as a listing finds them.
    pub fn found(&self) -> Vec<FoundSandbox> {
        self.state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .cloned()
            .collect()
    }

    /// Limits updates applied so far: (handle, limits).
    pub fn updates(&self) -> Vec<(String, Limits)> {
        self.state.lock().unwrap().updates.clone()
    }

    pub fn warm_ups(&self) -> usize {
        self.state.lock().unwrap().warm_ups
    }

    pub fn set_create_delay(&self, d: Duration) {
        *self.create_delay.lock().unwrap() = d;
    }

    pub fn set_alive(&self, creator: &str, alive: bool) {
        let mut set = self.alive.lock().unwrap();
        if alive {
            set.insert(creator.to_string());
        } else {
            set.remove(creator);
        }
    }

    /// Every `kill_tagged` asked of a sandbox so far: (session id, tag).
    pub fn kills(&self) -> Vec<(String, String)> {
        let st = self.state.lock().unwrap();
        st.kills
            .iter()
            .map(|(h, tag)| {
                let session = st.sandboxes.get(h).map(|f| f.session_id.clone());
                (session.unwrap_or_else(|| h.clone()), tag.clone())
            })
            .collect()
    }

    /// A running, kept sandbox of `owner` that replica `replica` made (another serve).
    pub fn insert_by_replica(&self, session_id: &str, owner: &str, replica: &str) {
        self.insert_by_replica_kept(session_id, owner, replica, true);
    }

    /// A running sandbox of `owner` that replica `replica` made, kept or not.
    pub fn insert_by_replica_kept(&self, session_id: &str, owner: &str, replica: &str, keep: bool) {
        self.insert(session_id, owner, SandboxState::Running, keep, ME);
        let mut st = self.state.lock().unwrap();
        if let Some(f) = st
            .sandboxes
            .values_mut()
            .find(|f| f.session_id == session_id)
        {
            f.replica = Some(replica.into());
        }
    }

    /// A sandbox made by someone else (another process, an older crash).
    pub fn insert(
        &self,
        session_id: &str,
        owner: &str,
        state: SandboxState,
        keep: bool,
        creator: &str,
    ) {
        let mut st = self.state.lock().unwrap();
        st.next += 1;
        let handle = format!("fake-{}", st.next);
        st.sandboxes.insert(
            handle.clone(),
            FoundSandbox {
                handle,
                session_id: session_id.into(),
                owner: Owner::new(owner).ok(),
                state,
                keep,
                creator: Some(creator.into()),
                limits: None,
                pooled: false,
                replica: None,
            },
        );
    }

    /// The session ids of every sandbox that exists, sorted.
    pub fn sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .map(|f| f.session_id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Makes a sandbox end behind sandboxd's back, as a cluster's eviction or a `docker rm
    /// -f` does: it is gone at once (its processes fail, liveness says so) and `vanished`
    /// reports it with `kind`. False if there is no such sandbox.
    pub fn vanish(&self, handle: &str, kind: VanishKind) -> bool {
        let Some(found) = self.state.lock().unwrap().sandboxes.remove(handle) else {
            return false;
        };
        let _ = self.reporter().send(Vanished {
            handle: handle.to_string(),
            session_id: found.session_id,
            kind,
        });
        true
    }

    /// How many processes were started in the fake's sandboxes.
    pub fn spawns(&self) -> usize {
        self.state.lock().unwrap().spawns
    }

    /// From now on every process started in a sandbox runs until its sandbox is gone (a
    /// command in progress), and gives no exit code then.
    pub fn hang_processes(&self, yes: bool) {
        self.hang.store(yes, std::sync::atomic::Ordering::Relaxed);
    }

    fn reporter(&self) -> &tokio::sync::broadcast::Sender<Vanished> {
        self.reports
            .get_or_init(|| tokio::sync::broadcast::channel(REPORTS_BUFFERED).0)
    }

    /// How many creates have started.
    pub fn creates(&self) -> usize {
        self.state.lock().unwrap().creates
    }

    fn sandbox(&self, handle: &str, session_id: &str, limits: &Limits) -> Arc<dyn Sandbox> {
        let exec = FakeExec {
            handle: handle.into(),
            state: self.state.clone(),
            hang: self.hang.clone(),
        };
        Arc::new(FakeSandbox {
            inner: ExecSandbox::new(exec, session_id.into(), limits.clone()),
            state: self.state.clone(),
            handle: handle.into(),
        })
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError> {
        self.state.lock().unwrap().creates += 1;
        let delay = *self.create_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let handle = {
            let mut st = self.state.lock().unwrap();
            st.next += 1;
            let handle = format!("fake-{}", st.next);
            st.made.push(handle.clone());
            let revision = self.revision.lock().unwrap().clone();
            st.revision_of.insert(handle.clone(), revision);
            // Through the metadata's entries, as a real backend records and reads them.
            let meta = spec.meta(ME);
            let entries: HashMap<&str, String> = meta
                .selectable()
                .into_iter()
                .chain(meta.annotations())
                .collect();
            let meta = SandboxMeta::read(|k| entries.get(k).map(String::as_str));
            let found = FoundSandbox::new(handle.clone(), SandboxState::Running, meta);
            st.sandboxes.insert(handle.clone(), found);
            handle
        };
        Ok((
            handle.clone(),
            self.sandbox(&handle, &spec.session_id, &spec.limits),
        ))
    }

    async fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        if found.state != SandboxState::Running {
            return Err(SandboxError::SandboxGone {
                session: found.session_id.clone(),
                message: format!("it is {}", found.state),
            });
        }
        Ok(self.sandbox(&found.handle, &found.session_id, limits))
    }

    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .cloned()
            .collect())
    }

    async fn remove(&self, handle: &str) -> Result<(), SandboxError> {
        self.state.lock().unwrap().sandboxes.remove(handle);
        Ok(())
    }

    async fn update_limits(&self, handle: &str, limits: &Limits) -> Result<bool, SandboxError> {
        if !*self.updates_accepted.lock().unwrap() {
            return Ok(false);
        }
        let mut st = self.state.lock().unwrap();
        if !st.sandboxes.contains_key(handle) {
            return Err(SandboxError::SandboxGone {
                session: handle.into(),
                message: "removed".into(),
            });
        }
        st.updates.push((handle.to_string(), limits.clone()));
        Ok(true)
    }

    async fn mark_claimed(&self, handle: &str, owner: &Owner) -> Result<(), SandboxError> {
        if *self.claims_fail.lock().unwrap() {
            return Err(SandboxError::Backend {
                backend: "fake",
                operation: "mark a claim".into(),
                message: "refused".into(),
            });
        }
        let mut st = self.state.lock().unwrap();
        st.claims.push((handle.to_string(), owner.to_string()));
        Ok(())
    }

    async fn memory_usage(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        let exists = self.state.lock().unwrap().sandboxes.contains_key(handle);
        Ok(if exists {
            *self.memory_each.lock().unwrap()
        } else {
            None
        })
    }

    async fn image_revision(&self) -> Result<Option<String>, SandboxError> {
        Ok(Some(self.revision.lock().unwrap().clone()))
    }

    async fn creator_alive(&self, creator: &str) -> bool {
        self.alive.lock().unwrap().contains(creator)
    }

    fn vanished(&self) -> tokio::sync::broadcast::Receiver<Vanished> {
        self.reporter().subscribe()
    }
}

/// The exec backend of a fake sandbox: processes end at once, liveness is the record's.
pub struct FakeExec {
    handle: String,
    state: Arc<Mutex<State>>,
    hang: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl ExecBackend for FakeExec {
    async fn spawn(
        &self,
        _req: &SpawnRequest,
        _attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError> {
        if !self.is_alive().await {
            return Err(SandboxError::SandboxGone {
                session: self.handle.clone(),
                message: "removed".into(),
            });
        }
        self.state.lock().unwrap().spawns += 1;
        if self.hang.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(AttachedProcess {
                stdin: Box::pin(tokio::io::sink()),
                output: Box::pin(futures::stream::pending()),
                exit_code: Box::new(|| Box::pin(std::future::pending())),
            });
        }
        Ok(AttachedProcess {
            stdin: Box::pin(tokio::io::sink()),
            output: Box::pin(futures::stream::empty()),
            exit_code: Box::new(|| Box::pin(async { Some(0) })),
        })
    }

    async fn is_alive(&self) -> bool {
        self.state
            .lock()
            .unwrap()
            .sandboxes
            .contains_key(&self.handle)
    }
}

/// A fake sandbox: the real `ExecSandbox` over `FakeExec`, whose warm-up only counts (the
/// fake backend cannot speak the shell's protocol).
pub struct FakeSandbox {
    inner: ExecSandbox<FakeExec>,
    state: Arc<Mutex<State>>,
    handle: String,
}

#[async_trait]
impl Sandbox for FakeSandbox {
    fn session_id(&self) -> &str {
        self.inner.session_id()
    }
    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        self.inner.exec(req).await
    }
    async fn spawn(&self, req: SpawnRequest) -> Result<AttachedProcess, SandboxError> {
        self.inner.spawn(req).await
    }
    async fn shell(&self, command: &str, opts: ShellOptions) -> Result<ShellOutput, SandboxError> {
        self.inner.shell(command, opts).await
    }
    async fn shell_stream(
        &self,
        command: &str,
        opts: ShellOptions,
        to: ShellStream,
    ) -> Result<ShellOutput, SandboxError> {
        self.inner.shell_stream(command, opts, to).await
    }
    async fn restart_shell(&self) -> Result<(), SandboxError> {
        self.inner.restart_shell().await
    }
    async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        self.inner.read_file(path).await
    }
    async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        self.inner.write_file(path, data).await
    }
    async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        self.inner.list_dir(path).await
    }
    async fn stat(&self, path: &str) -> Result<FileStat, SandboxError> {
        self.inner.stat(path).await
    }
    async fn mkdir(&self, path: &str) -> Result<(), SandboxError> {
        self.inner.mkdir(path).await
    }
    async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError> {
        self.inner.remove(path, recursive).await
    }
    async fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<(), SandboxError> {
        self.inner.upload_tar(dir, archive).await
    }
    async fn download_tar(&self, dir: &str) -> Result<Vec<u8>, SandboxError> {
        self.inner.download_tar(dir).await
    }
    async fn kill_tagged(&self, tag: &str) -> Result<(), SandboxError> {
        self.state
            .lock()
            .unwrap()
            .kills
            .push((self.handle.clone(), tag.to_string()));
        self.inner.kill_tagged(tag).await
    }
    async fn is_alive(&self) -> bool {
        self.inner.is_alive().await
    }
    async fn warm_up(&self) -> Result<(), SandboxError> {
        if !self.inner.is_alive().await {
            return Err(SandboxError::SandboxGone {
                session: self.session_id().into(),
                message: "removed".into(),
            });
        }
        self.state.lock().unwrap().warm_ups += 1;
        Ok(())
    }
}
