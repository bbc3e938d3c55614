//! Test support shared by the workspace's test binaries: a fake `Runtime` (sandboxes as host
//! processes, for logic that needs no container), a scripted OpenAI-compatible LLM server
//! (the only fake at the model boundary), a fake web for the research tools,
//! and the conformance suites every `Store` and `Runtime` backend runs (conformance/).
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod conformance;
pub mod fake_llm;
pub mod fake_runtime;
pub mod fake_web;
