-- sandboxd store, schema version 5: kept sessions' tool records (the browser's endpoint and
-- tabs, the editor's undo history, the plans), opaque bytes per (session, kind), at most
-- 32 MiB each. `session_id` is the runtime's session id (a session row's runtime_id), which
-- the session manager writes and deletes them by; no foreign key, as a record may outlive
-- its row until the manager sees the session end. A rowid table: records can be large.
CREATE TABLE tool_records (
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    bytes BLOB NOT NULL,
    UNIQUE (session_id, kind)
);
