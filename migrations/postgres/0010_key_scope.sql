-- A client key's scope (as ../0010_key_scope.sql): 1 an admin key, 0 a client key.
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1));
