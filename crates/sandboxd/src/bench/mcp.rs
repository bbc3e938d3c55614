//! The MCP round-trip benchmark for `sandboxd bench`: tools/call of bash `true` over
//! streamable HTTP on loopback, through the real server (auth, rmcp, registry, persistent
//! shell), once the session's sandbox exists. The first (cold) call, which creates the
//! container, is reported apart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use sandboxd_core::config::Config;
use sandboxd_core::mcp::server::ServerState;
use sandboxd_core::sandbox::{Owner, SessionManager};
use sandboxd_server::mcp_http::HttpServer;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("the benchmark MCP server could not start: {0}")]
    Server(String),
    #[error("the benchmark MCP client failed: {0}")]
    Client(String),
    #[error("bash `true` failed over MCP: {0}")]
    Call(String),
}

#[derive(Debug, Clone)]
pub struct McpCallBench {
    /// The first call: creates the container.
    pub cold: Duration,
    /// Warm calls, sorted.
    pub samples: Vec<Duration>,
}

impl McpCallBench {
    pub fn percentile(&self, q: f64) -> Duration {
        crate::bench::stats::percentile(&self.samples, q)
    }

    /// One markdown table row: what, n, p50, p90, p99, cold.
    pub fn table_row(&self) -> String {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        format!(
            "| MCP tools/call bash `true` (streamable HTTP, loopback) | {} | {} | {} | {} | {} |",
            self.samples.len(),
            ms(self.percentile(0.5)),
            ms(self.percentile(0.9)),
            ms(self.percentile(0.99)),
            ms(self.cold)
        )
    }
}

/// Runs `iterations` warm calls; the container is removed before returning.
pub async fn bench_mcp_call(
    manager: Arc<SessionManager>,
    config: Config,
    iterations: usize,
) -> Result<McpCallBench, BenchError> {
    let owner = Owner::new("mcp-bench").map_err(|e| BenchError::Server(e.to_string()))?;
    let state = ServerState::new(manager, config, owner);
    let token = hex::encode(rand::random::<[u8; 24]>());
    let addr = "127.0.0.1:0"
        .parse()
        .map_err(|e| BenchError::Server(format!("{e}")))?;
    let server = HttpServer::bind(addr, token.clone())
        .await
        .map_err(|e| BenchError::Server(e.to_string()))?;
    let url = format!("http://{}/mcp", server.addr);
    let stop = CancellationToken::new();
    let serving = tokio::spawn(server.serve(state, stop.clone()));

    let result = async {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
        );
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("sandboxd-bench", env!("CARGO_PKG_VERSION")),
        );
        let client = info
            .serve(transport)
            .await
            .map_err(|e| BenchError::Client(e.to_string()))?;
        let call = || {
            let args = json!({"command": "true"})
                .as_object()
                .cloned()
                .unwrap_or_default();
            client.call_tool(CallToolRequestParams::new("bash").with_arguments(args))
        };
        let t = Instant::now();
        let first = call().await.map_err(|e| BenchError::Call(e.to_string()))?;
        let cold = t.elapsed();
        if first.is_error == Some(true) {
            return Err(BenchError::Call(format!("{:?}", first.content)));
        }
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let t = Instant::now();
            let r = call().await.map_err(|e| BenchError::Call(e.to_string()))?;
            samples.push(t.elapsed());
            if r.is_error == Some(true) {
                return Err(BenchError::Call(format!("{:?}", r.content)));
            }
        }
        samples.sort();
        let _ = client.cancel().await;
        Ok(McpCallBench { cold, samples })
    }
    .await;

    stop.cancel();
    let _ = serving.await;
    result
}
