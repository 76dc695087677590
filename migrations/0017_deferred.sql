-- Deferred work (issue 41): a request that said it can wait, marked so that `frugal report` and
-- the dashboard show it apart. PostgreSQL's twin is postgres/0017_deferred.sql.

-- The tier the deferred work asked for: 'flex' (a request with service_tier "flex", given
-- [batch] flex_timeout_s as its local deadline); NULL for interactive work. It is what the
-- request asked for, whatever route answered it; `service_tier` (0013) is what its call was
-- billed at. Rows written before this migration have NULL: they were interactive.
ALTER TABLE requests ADD COLUMN deferred_tier TEXT;

-- The report's deferred section reads these rows of a period alone (a few among many).
CREATE INDEX requests_deferred ON requests (ts) WHERE deferred_tier IS NOT NULL;
