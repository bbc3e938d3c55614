-- sandboxd store, schema version 17 (issue 25, item 3): the code interpreter's contexts
-- (E2B's /contexts) as rows, so every replica serves the same ones and the cap is counted
-- here. A session's contexts go when it ends (the trigger) or its row is deleted (the key);
-- a hibernation marks them `lost` (their interpreters went with the container), and the
-- first use after it clears the mark by a conditional update.
CREATE TABLE code_contexts (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    language TEXT NOT NULL,
    cwd TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    lost INTEGER NOT NULL DEFAULT 0,
    holder TEXT,
    PRIMARY KEY (session_id, id)
);
CREATE TRIGGER code_contexts_session_ended AFTER UPDATE OF state ON sessions
WHEN NEW.state = 'ended'
BEGIN
    DELETE FROM code_contexts WHERE session_id = NEW.id;
END;
CREATE TRIGGER code_contexts_session_hibernated AFTER UPDATE OF snapshot ON sessions
WHEN NEW.snapshot IS NOT NULL AND OLD.snapshot IS NULL
BEGIN
    UPDATE code_contexts SET lost = 1 WHERE session_id = NEW.id;
END;
