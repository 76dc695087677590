-- Deferred work (as ../0017_deferred.sql): the tier a request that can wait asked for.
ALTER TABLE requests ADD COLUMN deferred_tier TEXT;
CREATE INDEX requests_deferred ON requests (ts) WHERE deferred_tier IS NOT NULL;
