-- sandboxd store, schema version 12 (issue 26): the agent profile a run was started with
-- (`POST /v1/runs {"agent": …}`), so every replica shows it and a follow-up keeps it. NULL:
-- a plan, an A2A task, or a run from before this version.
ALTER TABLE runs ADD COLUMN agent TEXT;
