-- sandboxd store on PostgreSQL, schema version 10 (issue 24, item 5): users' egress
-- credentials. One row per (owner, host); `sealed` is the value under AEAD (egress/vault.rs:
-- a random nonce, the ciphertext and its tag, bound to owner, host and header), never the
-- value itself. Gone with the user.
CREATE TABLE egress_credentials (
    owner TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    host TEXT NOT NULL,
    header TEXT NOT NULL,
    prefix TEXT NOT NULL,
    allow_http BOOLEAN NOT NULL,
    sealed BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (owner, host)
);
