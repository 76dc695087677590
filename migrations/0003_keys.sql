-- Client keys of the proxy (`frugal keys create|list|revoke`). Only the SHA-256 digest of a key
-- is stored: the key itself is printed once, by `frugal keys create`, and never again.
CREATE TABLE api_keys (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL,          -- what the ledger, the report and the logs show
    key_hash    TEXT    NOT NULL UNIQUE,   -- hex SHA-256 of the key
    hint        TEXT    NOT NULL,          -- the key's first characters, to tell keys apart
    created_at  REAL    NOT NULL,          -- unix time
    revoked_at  REAL                       -- unix time; NULL while the key is usable
);

-- A name belongs to at most one usable key; a revoked key's name can be given again.
CREATE UNIQUE INDEX api_keys_active_name ON api_keys (name) WHERE revoked_at IS NULL;

-- The name of the client key that made the request; NULL when the proxy runs without keys.
ALTER TABLE requests ADD COLUMN key_name TEXT;
