-- sandboxd store, schema version 13 (issue 28, item 3): the audit log. Append-only from the
-- API; bounded on every append by `[audit] retention_days` and `max_rows`. `seq` is the
-- page cursor; `details` is JSON without secrets.
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    request_id TEXT NOT NULL,
    client TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at_ms);
