-- What each key keeps in stored Responses, kept as a running tally (issue 39): the count and
-- the bytes that [responses] max_stored_per_key and max_stored_bytes_per_key hold it to. Summing
-- the key's rows of `responses` on every stored request cost time in proportion to what the key
-- had stored. PostgreSQL's twin is postgres/0015_responses_usage.sql;
-- proxy/ledger/responses_store.py keeps it in step with `responses`, in the same transactions.

-- owner: the key's identity, or '' for the keyless proxy (whose rows have owner NULL).
CREATE TABLE response_usage (
    owner TEXT    PRIMARY KEY,
    count INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0
);
INSERT INTO response_usage (owner, count, bytes)
SELECT coalesce(owner, ''), count(*), coalesce(sum(bytes), 0) FROM responses
GROUP BY coalesce(owner, '');
