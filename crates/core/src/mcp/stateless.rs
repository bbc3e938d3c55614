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

use std::collections::HashMap;
use std::sync::Arc;

use super::admission::{Admission, Ticket, create_admitted};
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
    /// is unknown, another owner's, or its session is gone (whose end is then reported).
    pub async fn get(
        &self,
        manager: &SessionManager,
        owner: &Owner,
        id: &str,
        admission: &dyn Admission,
    ) -> Option<(Arc<Session>, Arc<ToolRegistry>)> {
        let (session_id, registry) = {
            let map = self.map.lock().await;
            let e = map.get(id).filter(|e| &e.owner == owner)?;
            (e.session_id.clone(), e.registry.clone())
        };
        match manager.get(owner, &session_id).await {
            Ok(session) => Some((session, registry)),
            Err(_) => {
                if let Some(e) = self.map.lock().await.remove(id) {
                    admission
                        .ended(
                            &e.ticket,
                            "its sandbox was removed (idle, or over the memory budget)",
                        )
                        .await;
                }
                None
            }
        }
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
                _ => None,
            }
        };
        let Some(e) = taken else {
            return false;
        };
        admission.ended(&e.ticket, "sandbox_close").await;
        match manager.remove(owner, &e.session_id).await {
            Ok(()) => true,
            Err(SandboxError::SessionNotFound { .. }) => false,
            Err(err) => {
                tracing::warn!(session = %e.session_id, error = %err, "could not remove a stateless sandbox");
                true
            }
        }
    }

    /// Forgets every id (shutdown; the manager removes the sessions).
    pub async fn clear(&self) {
        self.map.lock().await.clear();
    }
}
