-- sandboxd store, schema version 18 (issue 25, item 4): a session's environment
-- (`env` at create, E2B's `envVars`) as a JSON object (NULL: none), so that a resumed session
-- and one attached by another replica give its processes the same variables.
ALTER TABLE sessions ADD COLUMN env TEXT;
