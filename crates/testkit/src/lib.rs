//! Test support shared by the workspace's test binaries: a fake `Runtime` (sandboxes as host
//! processes, for logic that needs no container), a scripted OpenAI-compatible LLM server
//! (the only fake at the model boundary), a fake web for the research tools,
//! the conformance suites every `Store` and `Runtime` backend runs (conformance/), and a
//! real `serve` process with a client of its API (serve/), given the binary's path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod conformance;
pub mod fake_llm;
pub mod fake_llm_stream;
pub mod fake_runtime;
pub mod fake_web;
pub mod serve;
