-- sandboxd store on PostgreSQL, schema version 8 (issue 22's step latency): an event's append
-- in one round trip. It was six statements on the wire (BEGIN, the run's row lock, the fence,
-- INSERT, the run's patch, pg_notify, COMMIT), each a wake-up of the backend process; now the
-- store sends one `SELECT … FROM sandboxd_append_event(…)` and this function does the same
-- steps, in the same order, inside the statement's own transaction.
--
-- VOLATILE (the default) on purpose: under READ COMMITTED each statement of a volatile
-- function takes a fresh snapshot, so the fence, run after the row lock was granted, sees the
-- driver and lease as they are then (a takeover that committed while we waited is seen), as
-- the separate statements did.
--
-- The result says which check refused, so the store maps it to the same errors as before:
-- 'ok' (appended), 'no_run' (no such run), 'fenced' (not in flight, not driven by
-- p_driver, or p_driver's lease is not live by the database's clock), 'seq' (p_seq does
-- not follow the run's last seq); `last` is the run's last seq before the call (NULL when
-- there is no run). A refusal changes nothing.
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
    OUT o_status TEXT,
    OUT o_last BIGINT
) LANGUAGE plpgsql AS $$
BEGIN
    -- The run's row lock first: a racing append (or a takeover) waits here until we commit.
    SELECT r.last_seq INTO o_last FROM runs r WHERE r.id = p_run FOR UPDATE;
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
    UPDATE runs SET
        state = COALESCE(p_state, state),
        outcome = COALESCE(p_outcome, outcome),
        answer = COALESCE(p_answer, answer),
        steps = COALESCE(p_steps, steps),
        input_tokens = input_tokens + p_add_input,
        output_tokens = output_tokens + p_add_output,
        question = CASE WHEN p_set_question THEN p_question ELSE question END,
        reply = CASE WHEN p_set_question THEN NULL ELSE reply END,
        started_at = COALESCE(started_at, p_started_at),
        ended_at = COALESCE(p_ended_at, ended_at),
        last_seq = p_seq
    WHERE id = p_run;
    -- Delivered at COMMIT, only if the statement's transaction commits.
    PERFORM pg_notify(p_channel, p_run);
    o_status := 'ok';
END
$$;
