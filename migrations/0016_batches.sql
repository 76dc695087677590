-- OpenAI's Files and Batch APIs, kept in the ledger database (issue 41): uploaded files with
-- their bytes, batches with every timestamp of their life, and one row per line of a batch's
-- input file, which workers claim through the database (a replica's lease on a line), so that a
-- proxy killed mid-batch resumes it and replicas on one database share it. PostgreSQL's twin is
-- postgres/0016_batches.sql; proxy/ledger/batches/ reads and writes them.

-- One row per file (file-...). owner: the key's identity, '' for the keyless proxy. content:
-- the file itself. expires_at: from expires_after, NULL for never.
CREATE TABLE batch_files (
    id          TEXT    PRIMARY KEY,
    owner       TEXT    NOT NULL,
    purpose     TEXT    NOT NULL,       -- batch | batch_output | ...
    filename    TEXT    NOT NULL,
    bytes       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,       -- unix seconds, as OpenAI's objects
    expires_at  INTEGER,
    status      TEXT    NOT NULL,       -- processed
    content     BLOB    NOT NULL
);
CREATE INDEX batch_files_owner ON batch_files (owner, created_at, id);
CREATE INDEX batch_files_expiry ON batch_files (expires_at) WHERE expires_at IS NOT NULL;

-- What each key keeps in files, as a running tally held to [batch] file_quota_bytes.
CREATE TABLE batch_file_usage (
    owner TEXT    PRIMARY KEY,
    bytes INTEGER NOT NULL DEFAULT 0
);

-- One row per batch (batch_...). The *_at columns are unix seconds, NULL until it got there.
CREATE TABLE batches (
    id                TEXT    PRIMARY KEY,
    owner             TEXT    NOT NULL,
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL,
    completion_window TEXT    NOT NULL,
    status            TEXT    NOT NULL,  -- validating | in_progress | finalizing | completed |
                                         -- failed | expired | cancelling | cancelled
    created_at        INTEGER NOT NULL,
    in_progress_at    INTEGER,
    finalizing_at     INTEGER,
    completed_at      INTEGER,
    failed_at         INTEGER,
    expired_at        INTEGER,
    cancelling_at     INTEGER,
    cancelled_at      INTEGER,
    expires_at        INTEGER NOT NULL,
    total             INTEGER NOT NULL DEFAULT 0,  -- request_counts, kept with the lines
    completed         INTEGER NOT NULL DEFAULT 0,
    failed            INTEGER NOT NULL DEFAULT 0,
    output_file_id    TEXT,
    error_file_id     TEXT,
    errors            TEXT,                        -- JSON, for a bad input file
    metadata          TEXT                         -- JSON object, or NULL
);
CREATE INDEX batches_owner ON batches (owner, created_at, id);
CREATE INDEX batches_open ON batches (status, expires_at);

-- One row per line of a batch's input file. seq: the order lines are claimed in (first in,
-- first out across batches). state: pending | claimed (by worker until lease_until) | deferred
-- (sent to the upstream's batch upstream_batch_id) | done (its result written once) |
-- cancelled. route: local | api, who answered. status_code, request_id, response: the answer;
-- error: JSON {code, message} when there is none.
CREATE TABLE batch_lines (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL UNIQUE,     -- batch_req_...: the output's id, the ledger row's request id
    batch_id          TEXT    NOT NULL,
    idx               INTEGER NOT NULL,            -- its line in the input file, from 0
    custom_id         TEXT    NOT NULL,
    method            TEXT    NOT NULL,
    url               TEXT    NOT NULL,
    body              TEXT    NOT NULL,            -- JSON
    state             TEXT    NOT NULL DEFAULT 'pending',
    worker            TEXT,
    lease_until       REAL,
    claims            INTEGER NOT NULL DEFAULT 0,  -- how many times it was claimed
    route             TEXT,
    upstream_batch_id TEXT,
    status_code       INTEGER,
    request_id        TEXT,
    response          TEXT,
    error             TEXT,
    finished_at       REAL,
    UNIQUE (batch_id, idx),
    UNIQUE (batch_id, custom_id)
);
CREATE INDEX batch_lines_open ON batch_lines (seq) WHERE state IN ('pending', 'claimed');
CREATE INDEX batch_lines_upstream ON batch_lines (upstream_batch_id)
    WHERE upstream_batch_id IS NOT NULL;
CREATE INDEX batch_lines_leases ON batch_lines (lease_until) WHERE state = 'claimed';
