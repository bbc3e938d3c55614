//! Sandboxes of stateless MCP clients (protocol 2026-07-28): the client holds a sandbox by
//! the opaque id `sandbox_create` returned and passes it to every tool.
//!
//! The sessions themselves live in the one SessionManager like every other session: owned
//! by the client's token (`token_owner`), counted against the global and per-owner caps,
//! touched on every call and removed by the manager's one idle reaper. What is kept here is
//! only what the manager cannot know: the id the client holds (128 random bits, so with a
//! shared token the id itself is the capability) and the tool registry bound to it. An id
//! whose session the reaper took answers "no sandbox", and its entry is dropped then, or at
//! the next create, so the map never outgrows the sessions the manager holds.
//!
//! The front end may also record each id (`Admission::record`; serve: in the store, owned
//! by the user): an id this process does not hold is then looked up there and its sandbox
//! attached, so a stateless client's calls may land on any of serve's replicas.

use std::collections::HashMap;
use std::sync::Arc;

use super::admission::{Admission, Ticket, attach_recorded, create_admitted};
use crate::config::Config;
use crate::sandbox::manager::Session;
use crate::sandbox::{Owner, SandboxError, SessionManager};
use crate::tools::ToolRegistry;

/// The owner of a stateless client's sandboxes: its bearer token, hashed (the token itself
/// never reaches a label). Clients sharing a token share an owner.
pub fn token_owner(authorization: &[u8]) -> Owner {
    Owner::from_secret("mcp-token", authorization)
}

struct Entry {
    owner: Owner,
    session_id: String,
    registry: Arc<ToolRegistry>,
    /// What the front end admitted it with (serve: its session row).
    ticket: Ticket,
}

/// The ids stateless clients hold, by id.
#[derive(Default)]
pub struct StatelessSandboxes {
    map: tokio::sync::Mutex<HashMap<String, Entry>>,
}

/// Why `sandbox_create` failed, in words for the client.
pub fn create_refusal(e: &SandboxError) -> String {
    match e {
        SandboxError::TooManySessionsForOwner { limit, .. } => format!(
            "you already hold {limit} open sandboxes, the most one client may; call sandbox_close on one you no longer need"
        ),
        // The front end's own words (serve: the user's session quota).
        SandboxError::Refused { message } => message.clone(),
        other => format!("sandboxd could not create a sandbox: {other}"),
    }
}

impl StatelessSandboxes {
    /// Creates a session for `owner`, admitted by `admission`, and returns the new id.
    pub async fn create(
        &self,
        manager: &Arc<SessionManager>,
        config: &Config,
        owner: &Owner,
        admission: &Arc<dyn Admission>,
    ) -> Result<String, SandboxError> {
        let (session, ticket) =
            create_admitted(admission.clone(), manager.clone(), owner.clone()).await?;
        let registry = crate::tools::session::SessionTools::server_registry(&session, config);
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        let live: Vec<String> = manager
            .live()
            .await
            .into_iter()
            .map(|s| s.id.clone())
            .collect();
        admission.record(&id, &ticket, &session).await;
        let mut map = self.map.lock().await;
        // Drop the ids whose sessions the reaper removed since.
        map.retain(|_, e| live.contains(&e.session_id));
        map.insert(
            id.clone(),
            Entry {
                owner: owner.clone(),
                session_id: session.id.clone(),
                registry,
                ticket,
            },
        );
        Ok(id)
    }

    /// The session of `owner`'s sandbox `id` (marked used) and its tools; None when the id
    /// is unknown, another owner's, or its session is gone (whose end is then reported). An
    /// id this process does not hold is looked up in the front end's records (another
    /// process made it) and its sandbox attached.
    pub async fn get(
        &self,
        manager: &SessionManager,
        config: &Config,
        owner: &Owner,
        id: &str,
        admission: &dyn Admission,
    ) -> Option<(Arc<Session>, Arc<ToolRegistry>)> {
        let held = {
            let map = self.map.lock().await;
            map.get(id)
                .map(|e| (e.owner.clone(), e.session_id.clone(), e.registry.clone()))
        };
        let Some((held_by, session_id, registry)) = held else {
            return self.attach(manager, config, owner, id, admission).await;
        };
        if &held_by != owner {
            return None;
        }
        match manager.get(owner, &session_id).await {
            Ok(session) => Some((session, registry)),
            Err(_) => {
                if let Some(e) = self.map.lock().await.remove(id) {
                    let why = manager.end_of(&session_id);
                    admission
                        .ended(&e.ticket, &super::lazy::gone_reason(why.as_ref()))
                        .await;
                }
                None
            }
        }
    }

    /// The sandbox recorded for `id` by another process, attached and held here.
    async fn attach(
        &self,
        manager: &SessionManager,
        config: &Config,
        owner: &Owner,
        id: &str,
        admission: &dyn Admission,
    ) -> Option<(Arc<Session>, Arc<ToolRegistry>)> {
        let r = admission.recorded(id).await?;
        let session = match attach_recorded(manager, owner, &r).await {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(sandbox = %id, session = %r.session_id, error = %e, "a stateless sandbox recorded by another process could not be attached");
                return None;
            }
        };
        let ticket = r.ticket;
        admission.record(id, &ticket, &session).await;
        let registry = crate::tools::session::SessionTools::server_registry(&session, config);
        self.map.lock().await.insert(
            id.to_string(),
            Entry {
                owner: owner.clone(),
                session_id: session.id.clone(),
                registry: registry.clone(),
                ticket,
            },
        );
        Some((session, registry))
    }

    /// Removes `owner`'s sandbox `id`; false when there is no such sandbox of this owner.
    pub async fn close(
        &self,
        manager: &SessionManager,
        owner: &Owner,
        id: &str,
        admission: &dyn Admission,
    ) -> bool {
        let taken = {
            let mut map = self.map.lock().await;
            match map.get(id) {
                Some(e) if &e.owner == owner => map.remove(id),
                Some(_) => return false,
                None => None,
            }
        };
        // One this process does not hold was made by another: its record says which.
        let (ticket, session_id) = match taken {
            Some(e) => (e.ticket, e.session_id),
            None => match admission.recorded(id).await {
                Some(r) => (r.ticket, r.session_id),
                None => return false,
            },
        };
        admission.forget(id).await;
        admission.ended(&ticket, "sandbox_close").await;
        match manager.remove(owner, &session_id).await {
            Ok(()) => true,
            Err(SandboxError::SessionNotFound { .. }) => false,
            Err(err) => {
                tracing::warn!(session = %session_id, error = %err, "could not remove a stateless sandbox");
                true
            }
        }
    }

    /// Forgets every id (shutdown; the manager removes the sessions).
    pub async fn clear(&self) {
        self.map.lock().await.clear();
    }
}
