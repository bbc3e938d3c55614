-- sandboxd store, schema version 6: the replica registry. One row per `serve` process on
-- this store, alive while `expires_at` (unix ms by the store's clock) is in the future;
-- the process renews it every third of its lease and deletes it on a graceful stop.
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    started_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
