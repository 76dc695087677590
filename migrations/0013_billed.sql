-- What an API call is billed for besides its text tokens at the standard rate (issue 39):
-- its service tier, its audio tokens and its web searches, so that proxy/ledger/pricing.py
-- prices the row at the tier's rates, the audio rates and the search fee. PostgreSQL's twin is
-- postgres/0013_billed.sql. Rows written before this migration have the defaults: they were
-- priced as text at the standard rate.

-- The tier the call was billed at: "priority", "flex" or "batch"; NULL for the standard rate
-- (no service_tier, "auto", "default"). The provider's answer says which, else the request.
ALTER TABLE requests ADD COLUMN service_tier TEXT;

-- Of prompt_tokens and completion_tokens, those that were audio
-- (prompt_tokens_details.audio_tokens, completion_tokens_details.audio_tokens).
ALTER TABLE requests ADD COLUMN audio_prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN audio_completion_tokens INTEGER NOT NULL DEFAULT 0;

-- Web searches the call made (a chat request with web_search_options: one; a Responses call:
-- its web_search_call items), and the search_context_size they were asked with (NULL: medium).
ALTER TABLE requests ADD COLUMN web_searches INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN search_context_size TEXT;
