//! Research without giving the sandbox a network: host-side search and fetch.
//!
//! The container keeps `network=none`. `web_search` and `web_fetch` (src/tools/web.rs) run
//! here on the host, through one `Fetcher` that enforces every SSRF rule, and write what
//! they bring back into the sandbox's /workspace/research, where python and the editor
//! work on it.

pub mod config;
mod own_addrs;
pub mod resolver;
pub mod ssrf;

pub use config::ResearchConfig;
