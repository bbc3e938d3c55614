-- sandboxd store, schema version 3: the web UI's sign-ins. Times are unix milliseconds.
-- A sign-in is bound to the key it was made with (key_hash): rotating or removing the key
-- ends it, as does its expiry. Only hashes of the cookie's token are kept.
CREATE TABLE web_logins (
    token_hash BLOB PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    key_hash BLOB NOT NULL,
    csrf TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX web_logins_by_user ON web_logins (user_id);
CREATE INDEX web_logins_by_expiry ON web_logins (expires_at);
