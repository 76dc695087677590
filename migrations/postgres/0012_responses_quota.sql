-- Stored Responses with a bound (as ../0012_responses_quota.sql): each row's size for the
-- per-key quota, and each distinct answer kept once.
ALTER TABLE responses ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE responses ADD COLUMN output_digest TEXT;
UPDATE responses SET bytes = octet_length(response) + octet_length(input_items);
CREATE INDEX responses_owner ON responses (owner, bytes);
CREATE INDEX responses_output ON responses (output_digest);

CREATE TABLE response_outputs (
    digest TEXT   PRIMARY KEY,
    output TEXT   NOT NULL,
    bytes  BIGINT NOT NULL
);
