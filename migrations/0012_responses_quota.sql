-- Stored Responses with a bound (issue 39): each row's size, so that a key's stored bytes can
-- be summed and held to [responses] max_stored_bytes_per_key (and its count to
-- max_stored_per_key), and answers kept once however many responses share them (a cache hit is
-- the same answer under a new id). PostgreSQL's twin is postgres/0012_responses_quota.sql.
-- proxy/ledger/responses_store.py reads and writes them.

-- bytes: what the row costs its key (UTF-8 bytes of its JSON, plus its answer's body when this
-- row stored it first). Rows stored before this migration are counted from their own columns.
-- output_digest: the answer's body in response_outputs (NULL: the row's response holds its
-- own output, as every row before this migration does).
ALTER TABLE responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE responses ADD COLUMN output_digest TEXT;
UPDATE responses SET bytes = length(CAST(response AS BLOB)) + length(CAST(input_items AS BLOB));
CREATE INDEX responses_owner ON responses (owner, bytes);
CREATE INDEX responses_output ON responses (output_digest);

-- One row per distinct answer (a response's output items, their ids left blank), named by the
-- sha256 of that JSON; deleted with the last response that names it.
CREATE TABLE response_outputs (
    digest TEXT    PRIMARY KEY,
    output TEXT    NOT NULL,
    bytes  INTEGER NOT NULL
);
