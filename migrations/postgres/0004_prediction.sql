-- Routing by predicted finish time (as ../0004_prediction.sql).
ALTER TABLE requests ADD COLUMN predicted_local_ms DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN actual_local_ms DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN backend TEXT;
ALTER TABLE requests ADD COLUMN predicted_completion_tokens BIGINT;

CREATE INDEX requests_prediction ON requests (ts, predicted_local_ms, actual_local_ms)
    WHERE predicted_local_ms IS NOT NULL AND actual_local_ms IS NOT NULL;
