//! A fake runtime: sandboxes as in-memory records, no Docker, so the session manager's
//! logic that depends on time (caps under concurrent creates, the idle reaper) and on other
//! processes (the reconciler) is tested in milliseconds under `tokio::time::pause()`.
//!
//! Its sandboxes are the real `ExecSandbox` over `FakeExec`, a backend that implements only
//! what the seam asks of a second backend (spawn and liveness): every process it starts
//! exits at once with status 0 and no output.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandboxd::config::Limits;
use sandboxd::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec};
use sandboxd::sandbox::{
    AttachedProcess, Owner, Sandbox, SandboxError, SandboxState, SpawnRequest,
};

/// The creator this "process" records; the fake treats it as alive unless told otherwise.
pub const ME: &str = "fake:me";

#[derive(Default)]
struct State {
    /// By handle.
    sandboxes: HashMap<String, FoundSandbox>,
    next: u64,
    creates: usize,
}

#[derive(Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    alive: Mutex<HashSet<String>>,
    /// How long a create takes (virtual time under pause).
    create_delay: Mutex<Duration>,
}

impl FakeRuntime {
    pub fn new() -> Arc<FakeRuntime> {
        let rt = FakeRuntime::default();
        rt.set_alive(ME, true);
        Arc::new(rt)
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

    /// How many creates have started.
    pub fn creates(&self) -> usize {
        self.state.lock().unwrap().creates
    }

    fn sandbox(&self, handle: &str, session_id: &str, limits: &Limits) -> Arc<dyn Sandbox> {
        let exec = FakeExec {
            handle: handle.into(),
            state: self.state.clone(),
        };
        Arc::new(ExecSandbox::new(exec, session_id.into(), limits.clone()))
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
            // Through the labels, as a real backend records and reads them.
            let labels = spec.labels(ME);
            let found = FoundSandbox::from_labels(handle.clone(), SandboxState::Running, &labels);
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

    fn creator_alive(&self, creator: &str) -> bool {
        self.alive.lock().unwrap().contains(creator)
    }
}

/// The exec backend of a fake sandbox: processes end at once, liveness is the record's.
pub struct FakeExec {
    handle: String,
    state: Arc<Mutex<State>>,
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
