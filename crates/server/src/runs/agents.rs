//! The agent profiles as the runs API offers them: GET /v1/agents lists them, and POST
//! /v1/runs names one in `agent`. The profiles themselves are `agent::profiles`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::RunMode;
use super::types::CreateRun;
use crate::AppState;
use crate::error::{ApiError, ErrorCode, ErrorResponses};
use sandboxd_core::agent::profiles::{Profile, Profiles};
use sandboxd_core::config::Config;

/// One agent profile.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AgentInfo {
    pub name: String,
    pub description: String,
    /// The tools it offers (terminate always is); null: every tool.
    pub tools: Option<Vec<String>>,
    /// Most steps of one of its runs (its own limit, or the admin's `[agent] max_steps`).
    pub max_steps: u64,
    /// Defined in the server's config rather than built in.
    pub user_defined: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentInfo>,
}

#[utoipa::path(get, path = "/v1/agents", tag = "runs",
    responses((status = 200, description = "The agent profiles a run may name", body = AgentList), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_agents(State(st): State<Arc<AppState>>) -> Result<Json<AgentList>, ApiError> {
    let profiles =
        Profiles::from_config(&st.config).map_err(|e| ApiError::internal(e.to_string()))?;
    let default_steps = st.config.agent.max_steps as u64;
    let agents = profiles
        .list()
        .iter()
        .map(|p| AgentInfo {
            name: p.name.clone(),
            description: p.description.clone(),
            tools: p.tools.clone(),
            max_steps: p.max_steps.map_or(default_steps, |n| n as u64),
            user_defined: p.user_defined,
        })
        .collect();
    Ok(Json(AgentList { agents }))
}

/// The agent profile a run asks for: None for a plan (its steps name profiles by tag), else
/// the named one or the default. An unknown name is a 404 listing the known ones (a name
/// that refers to nothing, like an unknown template; the document cannot list the profiles,
/// which come from the config, so a 400 would refuse input the schema allows).
pub(super) fn run_profile(config: &Config, body: &CreateRun) -> Result<Option<Profile>, ApiError> {
    if body.mode == Some(RunMode::Plan) {
        return match body.agent {
            Some(_) => Err(ApiError::invalid(
                "field `agent`: a plan's steps choose their profiles by tag; drop `agent` or use mode \"agent\"",
            )),
            None => Ok(None),
        };
    }
    let profiles = Profiles::from_config(config).map_err(|e| ApiError::internal(e.to_string()))?;
    match profiles.get(body.agent.as_deref()) {
        Ok(p) => Ok(Some(p.clone())),
        Err(e) => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("field `agent`: {e}"),
        )),
    }
}
