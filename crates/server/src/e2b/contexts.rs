//! The code interpreter's `/contexts`: the default context is the session's interpreter
//! (the python tool's); each created context is a separate python interpreter in the same
//! container (its own driver daemon, `sandboxd_pyrelay.py --context ID`), so its variables
//! are its own. At most `MAX_CONTEXTS` are created per sandbox; list, restart (a fresh
//! interpreter, same id) and remove (kills it and what it started, and its files) as the
//! SDK calls them.
//!
//! A created context is a row of the store (`CodeContexts`: id, language, cwd), so every
//! replica serves the same ones and the cap is counted there. Its interpreter is a process
//! of the container: the replica that serves a call reaches it through a handle of its own
//! (a cache in the session's slots; the row is looked up on every call, so one removed
//! elsewhere is gone here too), attaching to the process if it runs and starting it if not.
//! The interpreter serves one connection, the newest, so the row records the replica that
//! connected last (`holder`), and a replica that is not it connects anew before a call.
//! A hibernation removes the container and with it every interpreter: the store marks the
//! contexts lost, and the first call after the resume says that the variables are gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::E2bError;
use super::interp::check_language;
use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::ApiError;
use sandboxd_core::store::{CodeContextRow, ContextAdded, now_ms};
use sandboxd_core::tools::python::Python;
use sandboxd_core::tools::session::SessionTools;

/// The session's own interpreter.
pub(super) const DEFAULT_CONTEXT: &str = "default";
const CWD: &str = "/workspace";
/// Created contexts per sandbox (each is a python process holding its variables).
pub(super) const MAX_CONTEXTS: u32 = 8;
/// The longest cwd a context may name (Linux's PATH_MAX).
const MAX_CWD_BYTES: usize = 4096;

/// This replica's handles of the session's created contexts, by id: only a cache, the
/// store's rows say which contexts exist.
#[derive(Default)]
struct Handles(Mutex<HashMap<String, Arc<Python>>>);

impl Handles {
    fn of(live: &Live) -> Arc<Self> {
        live.session().slots.get_or_insert_with(Self::default)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Python>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of `row`'s interpreter (made on first use here; not started until used).
    fn get(&self, st: &AppState, live: &Live, row: &CodeContextRow) -> Arc<Python> {
        self.map()
            .entry(row.id.clone())
            .or_insert_with(|| {
                let session = SessionTools::of(live.session(), &st.config);
                Arc::new(session.python.in_context(&row.id, &row.cwd))
            })
            .clone()
    }

    fn forget(&self, id: &str) {
        self.map().remove(id);
    }
}

fn describe(id: &str, cwd: &str) -> Value {
    json!({"id": id, "language": "python", "cwd": cwd})
}

fn not_found(id: &str) -> E2bError {
    E2bError::not_found(format!(
        "context '{id}' not found: create one with create_code_context(), or leave the context out for '{DEFAULT_CONTEXT}'"
    ))
}

/// The created context `id` of the session, from the store; 404 when it has none of that
/// id (this replica's handle of one removed elsewhere goes then).
async fn row_of(st: &AppState, live: &Live, id: &str) -> Result<CodeContextRow, E2bError> {
    let row = st
        .store
        .code_context(&live.id, id)
        .await
        .map_err(|e| E2bError::from(ApiError::from(e)))?;
    row.ok_or_else(|| {
        Handles::of(live).forget(id);
        not_found(id)
    })
}

/// This replica's handle of `row`'s interpreter, connected anew when another replica
/// connected to it since this one did (its connection was taken over then), with this
/// replica recorded as the one connected.
async fn held(st: &AppState, live: &Live, row: &CodeContextRow) -> Result<Arc<Python>, E2bError> {
    let handles = Handles::of(live);
    let me = st.replica.id();
    if row.holder.as_deref() != Some(me) {
        handles.forget(&row.id);
        let held = st
            .store
            .hold_code_context(&live.id, &row.id, me)
            .await
            .map_err(|e| E2bError::from(ApiError::from(e)))?;
        if !held {
            // Removed by another replica since `row_of`: no interpreter for a context
            // without a row.
            return Err(not_found(&row.id));
        }
    }
    Ok(handles.get(st, live, row))
}

/// The interpreter a call names (the session's for none or the default, else a created
/// one), and what the caller must be told before its output: that this request resumed
/// the paused sandbox, or that the context's interpreter was lost (a pause) since its last
/// use and starts afresh.
pub(super) async fn python_of(
    st: &AppState,
    live: &Live,
    id: Option<&str>,
) -> Result<(Arc<Python>, Option<String>), E2bError> {
    let id = match id {
        None | Some(DEFAULT_CONTEXT) | Some("") => {
            let python = SessionTools::of(live.session(), &st.config).python.clone();
            return Ok((python, live.resumed.clone()));
        }
        Some(id) => id,
    };
    let row = row_of(st, live, id).await?;
    let python = held(st, live, &row).await?;
    let lost = row.lost
        && st
            .store
            .take_code_context_loss(&live.id, id)
            .await
            .map_err(|e| E2bError::from(ApiError::from(e)))?;
    let note = match (live.resumed.clone(), lost) {
        (Some(resumed), _) => Some(resumed),
        (None, true) => Some(format!(
            "the sandbox was paused and resumed since context '{id}' was last used, so its python interpreter was started afresh: variables and imports from earlier calls are gone"
        )),
        (None, false) => None,
    };
    Ok((python, note))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct CreateBody {
    language: Option<String>,
    cwd: Option<String>,
}

pub(super) async fn create_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Option<Json<CreateBody>>,
) -> Result<Json<Value>, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let body = body.map(|Json(b)| b).unwrap_or_default();
    check_language(body.language.as_deref())?;
    let cwd = body
        .cwd
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| CWD.into());
    if !cwd.starts_with('/') || cwd.contains('\0') || cwd.len() > MAX_CWD_BYTES {
        let shown: String = cwd.chars().take(80).filter(|c| !c.is_control()).collect();
        return Err(E2bError::invalid(format!(
            "the context's cwd '{shown}' is not an absolute path of at most {MAX_CWD_BYTES} bytes without NUL"
        )));
    }
    let row = CodeContextRow {
        session_id: live.id.clone(),
        id: uuid::Uuid::new_v4().simple().to_string(),
        language: "python".into(),
        cwd: cwd.clone(),
        created_at: now_ms(),
        lost: false,
        holder: Some(st.replica.id().to_string()),
    };
    let added = st
        .store
        .add_code_context(row.clone(), MAX_CONTEXTS)
        .await
        .map_err(|e| E2bError::from(ApiError::from(e)))?;
    match added {
        ContextAdded::Added => {}
        ContextAdded::Full => {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this sandbox has {MAX_CONTEXTS} code contexts, the most sandboxd makes (each is a python process): remove one with remove_code_context() first"
                ),
            ));
        }
        ContextAdded::NoSession => {
            return Err(E2bError::new(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {} was not found: it has ended", live.id),
            ));
        }
    }
    // Started now, so a cwd it cannot start in is this call's error.
    let python = Handles::of(&live).get(&st, &live, &row);
    if let Err(e) = python.start().await {
        Handles::of(&live).forget(&row.id);
        if let Err(e) = st.store.remove_code_context(&live.id, &row.id).await {
            tracing::warn!(session = %live.id, error = %e, "could not remove a code context that did not start");
        }
        return Err(E2bError::invalid(format!(
            "the context's python interpreter could not start in {cwd}: {e}"
        )));
    }
    Ok(Json(describe(&row.id, &cwd)))
}

pub(super) async fn list_contexts(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Result<Json<Value>, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let rows = st
        .store
        .code_contexts(&live.id)
        .await
        .map_err(|e| E2bError::from(ApiError::from(e)))?;
    let mut all = vec![describe(DEFAULT_CONTEXT, CWD)];
    all.extend(rows.iter().map(|c| describe(&c.id, &c.cwd)));
    Ok(Json(Value::Array(all)))
}

pub(super) async fn restart_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let (python, _) = python_of(&st, &live, Some(&id)).await?;
    python
        .restart()
        .await
        .map_err(|e| E2bError::from(ApiError::internal(e)))?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn remove_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    if id == DEFAULT_CONTEXT {
        return Err(E2bError::invalid(format!(
            "the context '{DEFAULT_CONTEXT}' is the sandbox's interpreter and cannot be removed; restart it instead"
        )));
    }
    let row = row_of(&st, &live, &id).await?;
    let python = held(&st, &live, &row).await?;
    // The row first, so no replica serves the context once its interpreter is going.
    let removed = st
        .store
        .remove_code_context(&live.id, &id)
        .await
        .map_err(|e| E2bError::from(ApiError::from(e)))?;
    Handles::of(&live).forget(&id);
    if !removed {
        return Err(not_found(&id));
    }
    python
        .shut_down()
        .await
        .map_err(|e| E2bError::from(ApiError::internal(e)))?;
    Ok(StatusCode::NO_CONTENT)
}
