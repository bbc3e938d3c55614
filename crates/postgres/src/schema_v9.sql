-- sandboxd store on PostgreSQL, schema version 9 (issue 22's step latency, second cut).
--
-- 1. A run's patch has one source: `sandboxd_patch_run`, called by the event append below
--    and by the store's `patch_run` (runs.rs), where the same UPDATE was written twice (in
--    Rust and in schema_v8's function) and could drift apart.
-- 2. An event's append also counts the owner's input tokens of the day (the daily quota's
--    `token_usage` row) when asked to, in the same statement: a model answer was two round
--    trips (its `token_usage` event, then the counter's upsert), now it is one. A refused
--    append counts nothing.
--
-- The append's steps and their order are schema_v8's (see there why the function is
-- VOLATILE); the token count comes last, after the run's row lock, so two appends of one
-- owner's runs take the run lock, then the day's row, never the other way round.

-- `p_last_seq` NULL keeps the run's last seq (a patch without an event). plpgsql, not sql: a
-- plpgsql function keeps its statements' plans for the connection's life, where a non-inlined
-- sql function plans its UPDATE again on every call (every event).
CREATE FUNCTION sandboxd_patch_run(
    p_run TEXT,
    p_state TEXT,
    p_outcome TEXT,
    p_answer TEXT,
    p_steps BIGINT,
    p_add_input BIGINT,
    p_add_output BIGINT,
    p_set_question BOOLEAN,
    p_question TEXT,
    p_started_at BIGINT,
    p_ended_at BIGINT,
    p_last_seq BIGINT
) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET
        state = COALESCE(p_state, state),
        outcome = COALESCE(p_outcome, outcome),
        answer = COALESCE(p_answer, answer),
        steps = COALESCE(p_steps, steps),
        input_tokens = input_tokens + p_add_input,
        output_tokens = output_tokens + p_add_output,
        question = CASE WHEN p_set_question THEN p_question ELSE question END,
        -- A reply answers the question it was posted to, never the next one.
        reply = CASE WHEN p_set_question THEN NULL ELSE reply END,
        started_at = COALESCE(started_at, p_started_at),
        ended_at = COALESCE(p_ended_at, ended_at),
        last_seq = COALESCE(p_last_seq, last_seq)
    WHERE id = p_run;
END
$$;

-- Replicas of one database run one version (the migration refuses an older binary a newer
-- schema), so the old signature goes rather than staying as a second copy of the patch.
DROP FUNCTION sandboxd_append_event(
    TEXT, TEXT, BIGINT, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT, BIGINT, BOOLEAN,
    TEXT, BIGINT, BIGINT, TEXT
);

-- As schema_v8's, plus: with `p_count_owner` it adds `p_add_input` to the run owner's
-- `token_usage` row of `p_day` and answers the day's total in `o_owner_tokens` (NULL
-- otherwise).
CREATE FUNCTION sandboxd_append_event(
    p_run TEXT,
    p_driver TEXT,
    p_seq BIGINT,
    p_time BIGINT,
    p_kind TEXT,
    p_payload TEXT,
    p_state TEXT,
    p_outcome TEXT,
    p_answer TEXT,
    p_steps BIGINT,
    p_add_input BIGINT,
    p_add_output BIGINT,
    p_set_question BOOLEAN,
    p_question TEXT,
    p_started_at BIGINT,
    p_ended_at BIGINT,
    p_channel TEXT,
    p_count_owner BOOLEAN,
    p_day TEXT,
    OUT o_status TEXT,
    OUT o_last BIGINT,
    OUT o_owner_tokens BIGINT
) LANGUAGE plpgsql AS $$
DECLARE
    v_owner TEXT;
BEGIN
    -- The run's row lock first: a racing append (or a takeover) waits here until we commit.
    SELECT r.last_seq, r.owner INTO o_last, v_owner FROM runs r WHERE r.id = p_run FOR UPDATE;
    IF NOT FOUND THEN
        o_status := 'no_run';
        RETURN;
    END IF;
    PERFORM 1 FROM runs r JOIN replicas p ON p.id = r.driver
     WHERE r.id = p_run AND r.driver = p_driver
       AND r.state IN ('queued', 'running', 'waiting_for_human')
       AND p.expires_at > (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF NOT FOUND THEN
        o_status := 'fenced';
        RETURN;
    END IF;
    -- Not `o_last + 1`: p_seq is never negative (the store clamps it), so this never overflows.
    IF p_seq - 1 <> o_last THEN
        o_status := 'seq';
        RETURN;
    END IF;
    INSERT INTO events (run_id, seq, time, kind, payload)
    VALUES (p_run, p_seq, p_time, p_kind, p_payload);
    PERFORM sandboxd_patch_run(
        p_run, p_state, p_outcome, p_answer, p_steps, p_add_input, p_add_output,
        p_set_question, p_question, p_started_at, p_ended_at, p_seq);
    IF p_count_owner THEN
        INSERT INTO token_usage (owner, day, input_tokens) VALUES (v_owner, p_day, p_add_input)
        ON CONFLICT (owner, day)
            DO UPDATE SET input_tokens = token_usage.input_tokens + excluded.input_tokens
        RETURNING input_tokens INTO o_owner_tokens;
    END IF;
    -- Delivered at COMMIT, only if the statement's transaction commits.
    PERFORM pg_notify(p_channel, p_run);
    o_status := 'ok';
END
$$;
