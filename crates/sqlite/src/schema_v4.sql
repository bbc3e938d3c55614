-- sandboxd store, schema version 4: what a session is. `api` sessions are made by
-- POST /v1/sessions (or a run) and live in kept containers; `mcp` sessions are the sandboxes
-- of /mcp clients, counted in the same quota, and end with the serve that made them.
ALTER TABLE sessions ADD COLUMN kind TEXT NOT NULL DEFAULT 'api' CHECK (kind IN ('api', 'mcp'));
