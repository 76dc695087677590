-- Hardening (issue 15): how many times a request was sent to the API, and which usage figures
-- of a row could not be true and so were not stored.

-- Calls made to the upstream API for this request, retries included (1: it went through at the
-- first try). NULL when the API was not called: a local answer, or a request refused before it
-- was routed. Rows written before this migration have NULL: the count was not kept.
ALTER TABLE requests ADD COLUMN upstream_attempts INTEGER;

-- The usage fields, comma separated (e.g. "prompt_tokens,completion_tokens"), that came with an
-- impossible value: a token count that is not an integer in [0, 2^31), or a cost beyond
-- SQLite's int64. They are stored as NULL (cached_tokens as 0), so the row's costs are unknown
-- rather than made up. NULL when every figure was valid.
ALTER TABLE requests ADD COLUMN usage_invalid TEXT;
