-- A client key's share of the server's requests in flight (as ../0009_key_concurrency.sql).
ALTER TABLE api_keys ADD COLUMN max_concurrency INTEGER CHECK (max_concurrency > 0);
