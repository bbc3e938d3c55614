-- sandboxd store on PostgreSQL, schema version 4 (issue 22, sessions across replicas): which replicas hold each session. A replica that
-- attaches a session records itself here; its persistent shell in the session carries its
-- tag, which a replica that finds it dead kills before anyone uses the session again, then
-- forgets the holder. Gone with the session row.
CREATE TABLE session_holders (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    replica_id TEXT NOT NULL,
    PRIMARY KEY (session_id, replica_id)
);
-- The reaper's conditional end finds a session by its runtime id.
CREATE INDEX sessions_by_runtime ON sessions (runtime_id);
