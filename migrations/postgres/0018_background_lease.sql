-- A background response's lease (as ../0018_background_lease.sql): until when the process
-- running it holds it, and who (host:pid); NULL, or past, and another replica may fail it.
ALTER TABLE responses ADD COLUMN lease_until DOUBLE PRECISION;
ALTER TABLE responses ADD COLUMN lease_owner TEXT;
CREATE INDEX responses_lease ON responses (lease_until) WHERE lease_until IS NOT NULL;
