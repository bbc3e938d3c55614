-- sandboxd store on PostgreSQL, schema version 14 (issue 28, item 2): usage metering. What
-- each session used (`session_usage`, its tokens per model in `session_usage_tokens`) and the same summed
-- per owner and UTC day (`usage_days`, `usage_day_tokens`), added to in one transaction so
-- the days always sum to the sessions. `cpu_reading_usec` (of container `cpu_container`) and
-- `sampled_at_ms` are the last cgroup sample, from which the next one adds its difference (a
-- restart goes on from them);
-- a sample locks its session's row (`SELECT … FOR UPDATE`), so two replicas' samples of one
-- session are serialized.
-- No foreign key to `sessions`: what was used stays countable after a session's history is
-- deleted or its owner removed.
CREATE TABLE session_usage (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    first_at_ms BIGINT NOT NULL,
    sampled_at_ms BIGINT,
    cpu_container TEXT,
    cpu_reading_usec BIGINT,
    cpu_usec BIGINT NOT NULL DEFAULT 0,
    memory_gib_secs DOUBLE PRECISION NOT NULL DEFAULT 0,
    wall_ms BIGINT NOT NULL DEFAULT 0,
    bytes_in BIGINT NOT NULL DEFAULT 0,
    bytes_out BIGINT NOT NULL DEFAULT 0,
    tool_calls BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX session_usage_by_owner ON session_usage (owner, first_at_ms);
CREATE INDEX session_usage_by_time ON session_usage (first_at_ms);
CREATE TABLE session_usage_tokens (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, model)
);
CREATE TABLE usage_days (
    owner TEXT NOT NULL,
    day TEXT NOT NULL,
    cpu_usec BIGINT NOT NULL DEFAULT 0,
    memory_gib_secs DOUBLE PRECISION NOT NULL DEFAULT 0,
    wall_ms BIGINT NOT NULL DEFAULT 0,
    bytes_in BIGINT NOT NULL DEFAULT 0,
    bytes_out BIGINT NOT NULL DEFAULT 0,
    tool_calls BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
);
CREATE INDEX usage_days_by_day ON usage_days (day);
CREATE TABLE usage_day_tokens (
    owner TEXT NOT NULL,
    day TEXT NOT NULL,
    model TEXT NOT NULL,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day, model)
);
