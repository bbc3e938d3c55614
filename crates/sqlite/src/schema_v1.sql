-- sandboxd store, schema version 1. Times are unix milliseconds.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL DEFAULT 0,
    key_hash BLOB NOT NULL UNIQUE,
    key_prefix TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    key_created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    expires_at INTEGER,
    quota TEXT NOT NULL DEFAULT '{}'
);

-- owner is a user id without a foreign key: a removed user's ended sessions stay until retention.
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('creating', 'running', 'ended')),
    limits TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    idle_timeout_secs INTEGER NOT NULL,
    runtime_id TEXT,
    container_id TEXT,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER NOT NULL,
    ended_at INTEGER,
    end_reason TEXT
);
CREATE INDEX sessions_by_owner ON sessions (owner, state);
CREATE INDEX sessions_by_state ON sessions (state);

-- The conversation of a session (a run in an existing session continues it).
CREATE TABLE conversations (
    session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    messages TEXT NOT NULL DEFAULT '[]',
    updated_at INTEGER NOT NULL
);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    task TEXT NOT NULL,
    state TEXT NOT NULL,
    outcome TEXT,
    answer TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    ended_at INTEGER
);
CREATE INDEX runs_by_owner ON runs (owner, state);
CREATE INDEX runs_by_session ON runs (session_id);

-- Events are committed before they are streamed; seq is per run, from 1.
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    time INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- Input tokens spent per user and UTC day, for the daily quota.
CREATE TABLE token_usage (
    owner TEXT NOT NULL,
    day TEXT NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
) WITHOUT ROWID;
