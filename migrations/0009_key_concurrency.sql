-- A client key's share of the server's requests in flight (issue 24, `frugal keys create
-- --max-concurrency N`); PostgreSQL's twin is postgres/0009_key_concurrency.sql.
-- NULL: the server's default ([server] max_concurrency_per_key, a quarter of max_concurrency).
ALTER TABLE api_keys ADD COLUMN max_concurrency INTEGER CHECK (max_concurrency > 0);
