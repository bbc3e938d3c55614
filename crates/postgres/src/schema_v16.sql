-- sandboxd store on PostgreSQL, schema version 16 (issue 25, item 3): the code
-- interpreter's contexts (E2B's /contexts) as rows, so every replica serves the same ones and
-- the cap is counted here (the add locks the session's row, so concurrent adds on any
-- replicas are counted one after the other). A session's contexts go when it ends (the
-- trigger) or its row is deleted (the key); a hibernation marks them `lost` (their
-- interpreters went with the container), and the first use after it clears the mark by a
-- conditional update. `holder` is the replica connected to the context's interpreter last
-- (it serves one connection, the newest).
CREATE TABLE code_contexts (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    language TEXT NOT NULL,
    cwd TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    lost BOOLEAN NOT NULL DEFAULT FALSE,
    holder TEXT,
    PRIMARY KEY (session_id, id)
);

CREATE FUNCTION sandboxd_code_contexts_follow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'ended' AND OLD.state <> 'ended' THEN
        DELETE FROM code_contexts WHERE session_id = NEW.id;
    ELSIF NEW.snapshot IS NOT NULL AND OLD.snapshot IS NULL THEN
        UPDATE code_contexts SET lost = TRUE WHERE session_id = NEW.id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER code_contexts_follow AFTER UPDATE OF state, snapshot ON sessions
FOR EACH ROW EXECUTE FUNCTION sandboxd_code_contexts_follow();
