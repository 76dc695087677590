-- What an API call is billed for besides its text tokens (as ../0013_billed.sql): its service
-- tier, its audio tokens and its web searches.
ALTER TABLE requests ADD COLUMN service_tier TEXT;
ALTER TABLE requests ADD COLUMN audio_prompt_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN audio_completion_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN web_searches BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN search_context_size TEXT;
