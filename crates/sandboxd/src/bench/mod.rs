//! The harnesses of `sandboxd bench`: each measures one path of sandboxd end to end with a
//! real sandbox and, where a model is involved, an in-process OpenAI-compatible responder
//! that answers at once, so what is measured is sandboxd's own overhead.

pub mod a2a;
pub mod agent;
pub mod browser;
pub mod e2b;
pub mod egress;
pub mod egress_ceiling;
pub mod egress_page;
pub mod flow;
pub mod hibernate;
pub mod kubernetes;
pub mod mcp;
pub mod mcp_stdio;
pub mod metrics;
pub mod replicas;
pub mod server;
pub mod server_runs;
pub mod stats;
pub mod stream;
pub mod support;
pub mod ui;
pub mod ui_stream;
pub mod web;
