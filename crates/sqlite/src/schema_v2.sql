-- sandboxd store, schema version 2: what the runs API keeps beside schema 1's runs table.
ALTER TABLE runs ADD COLUMN mode TEXT NOT NULL DEFAULT 'agent';
ALTER TABLE runs ADD COLUMN max_steps INTEGER;
ALTER TABLE runs ADD COLUMN steps INTEGER NOT NULL DEFAULT 0;
-- The pending ask_human question as JSON {text, asked_at, expires_at}, NULL when none.
ALTER TABLE runs ADD COLUMN question TEXT;
-- The seq of the run's last committed event (so a follower knows when it has them all).
ALTER TABLE runs ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_by_state ON runs (state);

-- Images referenced by a run's events (plots, screenshots), stored once per run.
CREATE TABLE images (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    media_type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;
