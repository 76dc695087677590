-- Routing by predicted finish time (issue 6): what the router predicted for a request's local
-- answer and what it took, so that `frugal report` and /metrics can show how good the
-- predictions are (the median absolute percentage error).

-- Milliseconds the router predicted the local answer would take from the request's arrival:
-- the work queued and running ahead of it on the chosen local backend plus its own prefill and
-- decode (the finish-time estimate). Recorded for requests that went local and for those sent to
-- the API because of it (reason predicted_slow); NULL when no prediction was made (the request
-- was forced to the API, the local model cannot serve it, or the rates were not known yet).
ALTER TABLE requests ADD COLUMN predicted_local_ms REAL;

-- Milliseconds the local attempt took when it ran to its end on the backend it was predicted
-- on: not stopped by its deadline, not failed, not moved to another backend. NULL otherwise.
-- The prediction error is measured on the rows that have both.
ALTER TABLE requests ADD COLUMN actual_local_ms REAL;

-- The local backend the request ran on, or was predicted on: "engine" (the bundled engine) or
-- the name of a [[local.backends]] entry.
ALTER TABLE requests ADD COLUMN backend TEXT;

-- The answer tokens the prediction expected (max_tokens, or the length learned for the model).
ALTER TABLE requests ADD COLUMN predicted_completion_tokens INTEGER;

-- The report's prediction error reads only the rows that have both numbers.
CREATE INDEX requests_prediction ON requests (ts, predicted_local_ms, actual_local_ms)
    WHERE predicted_local_ms IS NOT NULL AND actual_local_ms IS NOT NULL;
