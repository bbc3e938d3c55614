-- sandboxd store on PostgreSQL, schema version 1: the tables of the SQLite store's schemas 1-4
-- in one step, with the same names, columns and meanings (crates/sqlite/src/schema_v*.sql).
-- Times are unix milliseconds (BIGINT); JSON is kept as the text the store was given; key and
-- token hashes are BYTEA. `rowid` is the newest-first paging cursor SQLite's rowid is there.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    admin BOOLEAN NOT NULL DEFAULT FALSE,
    key_hash BYTEA NOT NULL UNIQUE,
    key_prefix TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    key_created_at BIGINT NOT NULL,
    last_used_at BIGINT,
    expires_at BIGINT,
    quota TEXT NOT NULL DEFAULT '{}'
);

-- owner is a user id without a foreign key: a removed user's ended sessions stay until retention.
CREATE TABLE sessions (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('creating', 'running', 'ended')),
    kind TEXT NOT NULL DEFAULT 'api' CHECK (kind IN ('api', 'mcp')),
    limits TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    idle_timeout_secs BIGINT NOT NULL,
    runtime_id TEXT,
    container_id TEXT,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT NOT NULL,
    ended_at BIGINT,
    end_reason TEXT
);
CREATE INDEX sessions_by_owner ON sessions (owner, state);
CREATE INDEX sessions_by_state ON sessions (state);

-- The conversation of a session (a run in an existing session continues it).
CREATE TABLE conversations (
    session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    messages TEXT NOT NULL DEFAULT '[]',
    updated_at BIGINT NOT NULL
);

CREATE TABLE runs (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    task TEXT NOT NULL,
    mode TEXT NOT NULL DEFAULT 'agent',
    max_steps BIGINT,
    state TEXT NOT NULL,
    outcome TEXT,
    answer TEXT,
    steps BIGINT NOT NULL DEFAULT 0,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    -- The pending ask_human question as JSON {text, asked_at, expires_at}, NULL when none.
    question TEXT,
    created_at BIGINT NOT NULL,
    started_at BIGINT,
    ended_at BIGINT,
    -- The seq of the run's last committed event (so a follower knows when it has them all).
    last_seq BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_owner ON runs (owner, state);
CREATE INDEX runs_by_session ON runs (session_id);
CREATE INDEX runs_by_state ON runs (state);

-- Events are committed before they are streamed; seq is per run, from 1.
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    time BIGINT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Images referenced by a run's events (plots, screenshots), stored once per run.
CREATE TABLE images (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    media_type TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (run_id, id)
);

-- Input tokens spent per user and UTC day, for the daily quota.
CREATE TABLE token_usage (
    owner TEXT NOT NULL,
    day TEXT NOT NULL,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
);

-- The web UI's sign-ins, each bound to the key it was made with (key_hash): rotating or
-- removing the key ends it, as does its expiry. Only hashes of the cookie's token are kept.
CREATE TABLE web_logins (
    token_hash BYTEA PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    key_hash BYTEA NOT NULL,
    csrf TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX web_logins_by_user ON web_logins (user_id);
CREATE INDEX web_logins_by_expiry ON web_logins (expires_at);
