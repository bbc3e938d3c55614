-- sandboxd store on PostgreSQL, schema version 6 (issue 22's numbering: versions 3-5 are the
-- replicas, runs and sessions steps): the sign-in throttle and serve's MCP sessions, so that
-- every replica counts failures into the same rows and can serve any MCP session.
--
-- auth_failures: one row per source (an IPv4 address or an IPv6 /64) with a window open:
-- its failures since `window_start` (unix ms). Ended windows are purged by later failures.
CREATE TABLE auth_failures (
    source TEXT PRIMARY KEY,
    window_start BIGINT NOT NULL,
    failures BIGINT NOT NULL
);
CREATE INDEX auth_failures_by_start ON auth_failures (window_start);

-- mcp_sessions: an /mcp session's owner, its client's `initialize` parameters (JSON) and the
-- sandbox it holds (its `sessions` row and the manager's id), by `Mcp-Session-Id`.
CREATE TABLE mcp_sessions (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    init TEXT NOT NULL,
    sandbox_row TEXT,
    sandbox_runtime_id TEXT,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT NOT NULL
);
CREATE INDEX mcp_sessions_by_use ON mcp_sessions (last_used_at);
