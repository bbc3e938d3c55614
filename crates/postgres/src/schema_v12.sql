-- sandboxd store on PostgreSQL, schema version 12 (issue 28, item 3): the audit log.
-- Append-only from the API; bounded on every append by `[audit] retention_days` and
-- `max_rows`. `seq` is the page cursor; `details` is JSON text without secrets.
CREATE TABLE audit_log (
    seq BIGSERIAL PRIMARY KEY,
    at_ms BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    request_id TEXT NOT NULL,
    client TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at_ms);
