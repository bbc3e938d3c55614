-- sandboxd store on PostgreSQL, schema version 7 (issue 24): each session's egress. `egress`
-- is the session's policy in its canonical form ("off", "any", "a.org,*.b.org,!c.b.org"),
-- read by every replica's proxy at each connection; the counters add up every record of the
-- session (the log below keeps only the newest); `egress_seq` numbers its records.
ALTER TABLE sessions ADD COLUMN egress TEXT NOT NULL DEFAULT 'off';
ALTER TABLE sessions ADD COLUMN egress_connections BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN egress_refused BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN egress_bytes_up BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN egress_bytes_down BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN egress_seq BIGINT NOT NULL DEFAULT 0;

-- egress_log: one row per connection through a session's proxy (an EgressRecord), gone
-- with its session (retention, history deletion) and bounded per session.
CREATE TABLE egress_log (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    owner TEXT NOT NULL,
    method TEXT NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    allowed BOOLEAN NOT NULL,
    rule TEXT NOT NULL,
    reason TEXT,
    bytes_up BIGINT NOT NULL,
    bytes_down BIGINT NOT NULL,
    started_ms BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
