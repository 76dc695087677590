-- Shadow audits (issue 17): a sample of local attempts, accepted and rejected alike, each
-- graded against the API's answer to the same request. One row per audit; the estimates
-- weight each row by `weight` (1 / the sampling rate when it was drawn).
-- Money is integer pico-dollars (1e-12 USD), as in `requests`.
CREATE TABLE audits (
    id              INTEGER PRIMARY KEY,
    request_id      TEXT    NOT NULL,             -- the request's x-request-id
    ts              REAL    NOT NULL,             -- unix time the audit was decided
    requested_model TEXT,                         -- what the client asked for
    task_kind       TEXT,                         -- quality.task kind: json, math, ..., other
    local_model     TEXT,                         -- the local model file's SHA-256 (or name)
    features        TEXT,                         -- the gate's features, a JSON object
    score           REAL,                         -- the gate's score of the local answer
    threshold       REAL,                         -- the threshold it was held to
    accepted        INTEGER NOT NULL CHECK (accepted IN (0, 1)),
    verdict         INTEGER CHECK (verdict IN (0, 1)),  -- 1 correct, 0 wrong, NULL failed
    method          TEXT CHECK (method IN ('exact', 'judge')),  -- NULL: no reference to grade
    error           TEXT,                         -- why a failed audit failed, a short code
    correctness     TEXT    NOT NULL CHECK (correctness IN ('strict', 'content')),
    judge_model     TEXT,                         -- NULL when no judge was asked
    cost_pusd       INTEGER NOT NULL DEFAULT 0 CHECK (cost_pusd >= 0),  -- shadow call + judge
    weight          REAL    NOT NULL CHECK (weight >= 1),
    -- Text, NULL unless [server] log_content is on:
    prompt          TEXT,                         -- the client's messages, JSON
    reference       TEXT,                         -- the API's answer
    candidate       TEXT,                         -- the local answer
    judge_reason    TEXT                          -- the judge's own words
);

-- A month's audits, overall and per requested model (estimates, the budget at start-up).
CREATE INDEX audits_ts ON audits (ts);
CREATE INDEX audits_model_ts ON audits (requested_model, ts);
-- Calibration reads the audits of one local model.
CREATE INDEX audits_local_model ON audits (local_model, ts);
