//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` attributes and
//! the wire types' schemas (never written by hand). docs/openapi.json is this document as
//! committed; a test fails when the two drift (`sandboxd serve --openapi > docs/openapi.json`
//! regenerates it).

use utoipa::Modify;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::error::{ErrorBody, ErrorCode};
use crate::exec_stream::{ExecCut, ExecExit, ExecHolding, ExecText};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd",
        description = "Self-hosted sandboxes: each session is a hardened, network-less container with a persistent shell, tools and files. Every route but the health checks needs `Authorization: Bearer sbx_…`; another user's objects answer 404. Errors are `{\"error\": {\"code\", \"message\"}}` with the codes of `ErrorCode`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorCode, ErrorBody, ExecText, ExecHolding, ExecCut, ExecExit)),
    tags(
        (name = "sessions", description = "Sandboxes and their persistent shell"),
        (name = "tools", description = "The agent's tools, called directly"),
        (name = "files", description = "Files and tar archives of /workspace"),
        (name = "runs", description = "Agent and plan runs in sessions, and their live events"),
        (name = "egress", description = "A user's secrets for the egress proxy (write-only values)"),
        (name = "users", description = "The caller, and the admin's view of users"),
        (name = "health", description = "Unauthenticated liveness and readiness"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("sbx_ API key")
                    .build(),
            ),
        );
    }
}

/// The document as served at /v1/openapi.json and committed as docs/openapi.json.
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = crate::routes(&sandboxd_core::config::Config::default())
        .merge(crate::health_routes())
        .split_for_parts();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The document as pretty JSON with a final newline (the committed file's form).
pub fn document_json() -> String {
    let mut s = document()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    /// docs/openapi.json must be exactly what the handlers generate.
    #[test]
    fn the_committed_document_matches_the_handlers() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = super::document_json();
        assert!(
            committed == generated,
            "docs/openapi.json is stale: regenerate it with `cargo run -- serve --openapi > docs/openapi.json`"
        );
        let v: serde_json::Value = serde_json::from_str(&generated).unwrap();
        assert_eq!(v["openapi"], "3.1.0");
    }
}
