-- One row per request the proxy received, whatever became of it.
-- Money is integer pico-dollars (1e-12 USD); NULL means the model has no known price.
CREATE TABLE requests (
    id                       INTEGER PRIMARY KEY,
    request_id               TEXT    NOT NULL,
    ts                       REAL    NOT NULL,             -- unix time the request arrived
    endpoint                 TEXT    NOT NULL,             -- e.g. chat.completions
    requested_model          TEXT,                         -- what the client asked for
    route                    TEXT    NOT NULL,             -- local | api | none
    reason                   TEXT    NOT NULL,             -- accepted, low_quality, forced, ...
    status                   INTEGER NOT NULL,             -- HTTP status sent to the client
    stream                   INTEGER NOT NULL DEFAULT 0,
    quality                  REAL,                         -- score of the local answer, if any
    quality_reasons          TEXT,                         -- top reasons, comma separated
    prompt_tokens            INTEGER,                      -- tokens of the answer that was sent
    completion_tokens        INTEGER,
    local_prompt_tokens      INTEGER,                      -- what the local attempt used
    local_completion_tokens  INTEGER,
    latency_ms               REAL    NOT NULL,             -- arrival to last byte
    local_ms                 REAL    NOT NULL DEFAULT 0,   -- time spent on the local attempt
    api_ms                   REAL    NOT NULL DEFAULT 0,   -- time spent waiting on the API
    api_cost_pusd            INTEGER,                      -- what was actually paid
    counterfactual_cost_pusd INTEGER,                      -- what the API would have charged
    error                    TEXT                          -- short error code, never content
);

CREATE INDEX requests_ts ON requests (ts);
