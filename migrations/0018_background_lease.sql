-- A background response's lease (issue 41): the unix time until which the process running it
-- holds it. The runner renews it while the response is queued or running there (every third
-- of [batch] line_lease_s, as a batch line's claim); a replica that starts, or one whose sweep
-- finds it, fails an open background response only once its lease has passed, so that a
-- replica starting beside another one never fails the other's running work, and one killed
-- with kill -9 leaves work that is failed once its lease runs out. A response that ends has its
-- lease cleared (NULL); a proxy that stops gives its queued ones a lease in the past. NULL on an
-- open one (rows written before this migration): lapsed, seen by the sweep at start. PostgreSQL's
-- twin is postgres/0018_background_lease.sql.
ALTER TABLE responses ADD COLUMN lease_until REAL;
-- Who holds the lease: the host and process id of the proxy running it (host:pid). A process
-- on the same host sees at once that the holder is gone (a restart after kill -9), instead of
-- waiting for the lease to pass.
ALTER TABLE responses ADD COLUMN lease_owner TEXT;

-- The periodic sweep reads the leased rows alone: the few open background responses.
CREATE INDEX responses_lease ON responses (lease_until) WHERE lease_until IS NOT NULL;
