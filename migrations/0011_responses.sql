-- Stored Responses (issue 26, `store`, the default): what `previous_response_id`, GET and
-- DELETE /v1/responses/{id} and its input_items read. PostgreSQL's twin is
-- postgres/0011_responses.sql. proxy/ledger/responses_store.py reads and writes them.

-- One row per stored response. owner is the identity of the key that made it (id:N for a
-- stored key, env:<sha256> for one of the environment's), NULL when the proxy ran without
-- keys; key_name is only its name, for people (a revoked key's name is handed on).
CREATE TABLE responses (
    id          TEXT    PRIMARY KEY,  -- resp_...
    owner       TEXT,
    key_name    TEXT,
    created_at  REAL    NOT NULL,     -- unix seconds; [responses] retention_days counts from it
    previous_id TEXT,                 -- the previous_response_id it continued, if any
    route       TEXT    NOT NULL,     -- local | api | cache: who answered this turn
    response    TEXT    NOT NULL,     -- the response object, JSON
    input_items TEXT    NOT NULL      -- this turn's input items (each with its id), JSON
);
CREATE INDEX responses_created ON responses (created_at);
