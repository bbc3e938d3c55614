-- sandboxd store on PostgreSQL, schema version 3: the replica registry. One row per `serve`
-- process on this database, alive while `expires_at` (unix ms by the database's clock) is in
-- the future; the process renews it every third of its lease and deletes it on a graceful
-- stop. Replicas on hosts whose clocks disagree still agree on who is alive.
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    started_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
