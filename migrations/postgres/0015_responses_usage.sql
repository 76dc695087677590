-- What each key keeps in stored Responses, as a running tally (as ../0015_responses_usage.sql).
CREATE TABLE response_usage (
    owner TEXT   PRIMARY KEY,
    count BIGINT NOT NULL DEFAULT 0,
    bytes BIGINT NOT NULL DEFAULT 0
);
INSERT INTO response_usage (owner, count, bytes)
SELECT coalesce(owner, ''), count(*), coalesce(sum(bytes), 0) FROM responses
GROUP BY coalesce(owner, '');
