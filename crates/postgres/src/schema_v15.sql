-- sandboxd store on PostgreSQL, schema version 15 (issue 28, item 4): single sign-on attempts
-- between the redirect to the OpenID Connect provider and its callback. The key is the
-- SHA-256 of the `state` sent (never the state itself); a row is taken (`DELETE … RETURNING`)
-- by the one callback that uses it, so a state works once even when two replicas receive it;
-- expired rows go whenever a new attempt is kept.
CREATE TABLE sso_states (
    state_hash BYTEA PRIMARY KEY,
    pkce_verifier TEXT NOT NULL,
    nonce TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sso_states_by_expiry ON sso_states (expires_at);
