-- Stored Responses (as ../0011_responses.sql): shared by every replica, so a chain can
-- continue on any of them.
CREATE TABLE responses (
    id          TEXT             PRIMARY KEY,
    owner       TEXT,
    key_name    TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    previous_id TEXT,
    route       TEXT             NOT NULL,
    response    TEXT             NOT NULL,
    input_items TEXT             NOT NULL
);
CREATE INDEX responses_created ON responses (created_at);
