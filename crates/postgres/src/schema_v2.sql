-- sandboxd store on PostgreSQL, schema version 2: kept sessions' tool records (the browser's
-- endpoint and tabs, the editor's undo history, the plans), opaque bytes per (session, kind),
-- at most 32 MiB each (checked before a write). `session_id` is the runtime's session id (a
-- session row's runtime_id), by which the session manager writes and deletes them; no
-- foreign key, as a record may outlive its row until the manager sees the session end.
CREATE TABLE tool_records (
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (session_id, kind)
);
