//! The code interpreter's `/contexts`: the default context is the session's interpreter
//! (the python tool's); each created context is a separate python interpreter in the same
//! container (its own driver daemon, `sandboxd_pyrelay.py --context ID`), so its variables
//! are its own. At most `MAX_CONTEXTS` are created per sandbox; list, restart (a fresh
//! interpreter, same id) and remove (kills it and what it started) as the SDK calls them.
//! Contexts are kept with the sandbox's live session: a pause (hibernation) ends them.

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
use sandboxd_core::tools::python::Python;
use sandboxd_core::tools::session::SessionTools;

/// The session's own interpreter.
pub(super) const DEFAULT_CONTEXT: &str = "default";
const CWD: &str = "/workspace";
/// Created contexts per sandbox (each is a python process holding its variables).
pub(super) const MAX_CONTEXTS: usize = 8;

struct Context {
    id: String,
    cwd: String,
    python: Arc<Python>,
}

/// The contexts created in a session, in order.
#[derive(Default)]
struct Contexts(Mutex<Vec<Context>>);

impl Contexts {
    fn of(live: &Live) -> Arc<Self> {
        live.session().slots.get_or_insert_with(Self::default)
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Context>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
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

/// The interpreter a call names: the session's for none or the default, else a created one.
pub(super) fn python_of(
    st: &AppState,
    live: &Live,
    id: Option<&str>,
) -> Result<Arc<Python>, E2bError> {
    match id {
        None | Some(DEFAULT_CONTEXT) | Some("") => {
            Ok(SessionTools::of(live.session(), &st.config).python.clone())
        }
        Some(id) => Contexts::of(live)
            .list()
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.python.clone())
            .ok_or_else(|| not_found(id)),
    }
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
    if !cwd.starts_with('/') {
        return Err(E2bError::invalid(format!(
            "the context's cwd '{cwd}' is not an absolute path"
        )));
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let python = Arc::new(
        SessionTools::of(live.session(), &st.config)
            .python
            .in_context(&id, &cwd),
    );
    let contexts = Contexts::of(&live);
    {
        let mut list = contexts.list();
        if list.len() >= MAX_CONTEXTS {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this sandbox has {MAX_CONTEXTS} code contexts, the most sandboxd makes (each is a python process): remove one with remove_code_context() first"
                ),
            ));
        }
        list.push(Context {
            id: id.clone(),
            cwd: cwd.clone(),
            python: python.clone(),
        });
    }
    // Started now, so a cwd it cannot start in is this call's error.
    if let Err(e) = python.restart().await {
        contexts.list().retain(|c| c.id != id);
        return Err(E2bError::invalid(format!(
            "the context's python interpreter could not start in {cwd}: {e}"
        )));
    }
    Ok(Json(describe(&id, &cwd)))
}

pub(super) async fn list_contexts(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Result<Json<Value>, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let mut all = vec![describe(DEFAULT_CONTEXT, CWD)];
    all.extend(
        Contexts::of(&live)
            .list()
            .iter()
            .map(|c| describe(&c.id, &c.cwd)),
    );
    Ok(Json(Value::Array(all)))
}

pub(super) async fn restart_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    python_of(&st, &live, Some(&id))?
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
    let contexts = Contexts::of(&live);
    let removed = {
        let mut list = contexts.list();
        let at = list
            .iter()
            .position(|c| c.id == id)
            .ok_or_else(|| not_found(&id))?;
        list.remove(at)
    };
    removed
        .python
        .shut_down()
        .await
        .map_err(|e| E2bError::from(ApiError::internal(e)))?;
    Ok(StatusCode::NO_CONTENT)
}
