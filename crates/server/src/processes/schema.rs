//! `StartProcess`'s schema, written out: exactly one of `command` and `argv` is JSON Schema's
//! `oneOf` beside the properties, which utoipa's derive cannot say; every pattern is what
//! `processes::check_spec` and the start take, so a document-valid start is never a 400.

use super::StartProcess;

impl utoipa::ToSchema for StartProcess {}

impl utoipa::PartialSchema for StartProcess {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        start_schema().into()
    }
}

/// `StartProcess` as the server takes it: `command` or `argv` (one, not null), each string
/// without NUL, argv's program not empty, `cwd` as for an exec, `env` as `env_schema`.
fn start_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::extensions::Extensions;
    use utoipa::openapi::schema::{
        AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, Type,
    };
    const NO_NUL: &str = "^[^\\u0000]*$";
    let text = |pattern: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
    };
    let nullable = |o: ObjectBuilder| {
        o.schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::String,
            Type::Null,
        ]))
    };
    let argv = ArrayBuilder::new()
        .prefix_items([text("^[^\\u0000]+$").min_length(Some(1))])
        .items(text(NO_NUL))
        .min_items(Some(1))
        .description(Some(
            "The program and its arguments, run as they are; give this or `command`",
        ));
    let argv_or_null = Schema::OneOf(
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(argv)
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .build(),
    );
    // JSON Schema's `oneOf` beside the properties: utoipa's Object has no builder for it,
    // and Extensions serialize their keys as given (as egress.rs's `contains`).
    let one = |field: &str, schema: serde_json::Value| serde_json::json!({"required": [field], "properties": {field: schema}});
    let alternatives = Extensions::from_iter([(
        "oneOf",
        serde_json::json!([
            one("command", serde_json::json!({"type": "string"})),
            one("argv", serde_json::json!({"type": "array"})),
        ]),
    )]);
    let mut env = crate::types::env_schema();
    env.description = Some(
        "Environment variables of this process (at most 128; names `[A-Za-z_][A-Za-z0-9_]*` but not `SANDBOXD_TAG`, values without NUL)".into(),
    );
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "command",
            nullable(text(NO_NUL)).description(Some(
                "A bash command line (run as `bash -c LINE`); give this or `argv`",
            )),
        )
        .property("argv", argv_or_null)
        .property("env", env)
        .property(
            "cwd",
            nullable(text("^[^\\u0000]+$").min_length(Some(1))).description(Some(
                "Its working directory (default /workspace; a relative path is under it). One that does not exist is a 404, one that is not a directory a 409",
            )),
        )
        .property(
            "tag",
            nullable(ObjectBuilder::new()).description(Some(
                "A name for it, unique among the session's running processes (a taken one is a 409)",
            )),
        )
        .property(
            "stdin",
            ObjectBuilder::new().schema_type(Type::Boolean).description(Some(
                "Keep stdin open for POST .../stdin (default false: it reads EOF at once)",
            )),
        )
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .extensions(Some(alternatives))
        .into()
}
