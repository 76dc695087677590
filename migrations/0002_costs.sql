-- What the report needs to be trusted: which API model a request was (or would have been) sent
-- to, the prompt tokens the provider served from its cache, the counterfactual token counts (the
-- tokenizer of the requested model, not the local one), the latency tax, and a daily rollup
-- that keeps `frugal report` fast on millions of rows.

-- The API model the request was sent to, or would have been sent to had the local answer been
-- rejected: the [fallback] models mapping applied to requested_model. NULL for model "local".
ALTER TABLE requests ADD COLUMN api_model TEXT;

-- Prompt tokens the provider reported as cached (prompt_tokens_details.cached_tokens).
ALTER TABLE requests ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;

-- The tokens the counterfactual is priced on: the provider's usage for an API answer, the
-- requested model's tokenizer (litellm.token_counter) for a local one.
ALTER TABLE requests ADD COLUMN counterfactual_prompt_tokens INTEGER;
ALTER TABLE requests ADD COLUMN counterfactual_completion_tokens INTEGER;

-- Where those counts came from: usage | tokenizer | local (the local model's own count, used
-- only when the requested model's tokenizer could not count) | NULL (no tokens known).
ALTER TABLE requests ADD COLUMN token_source TEXT;

-- Time spent on a local attempt whose answer was not used (rejected, timed out, failed).
ALTER TABLE requests ADD COLUMN latency_tax_ms REAL NOT NULL DEFAULT 0;

-- Rows written before this migration: their tokens were the answer's, and every local attempt
-- of a request that ended on the API was time lost.
UPDATE requests SET latency_tax_ms = local_ms WHERE route = 'api' AND local_ms > 0;
UPDATE requests
   SET counterfactual_prompt_tokens = prompt_tokens,
       counterfactual_completion_tokens = completion_tokens,
       token_source = CASE WHEN route = 'api' THEN 'usage' ELSE 'local' END
 WHERE prompt_tokens IS NOT NULL;

-- The p95 of the latency tax reads only the requests that paid it.
CREATE INDEX requests_tax ON requests (ts, latency_tax_ms) WHERE latency_tax_ms > 0;

-- Per UTC day, model, reason, route and outcome: the sums `frugal report` shows. Triggers keep
-- it equal to the sum of the rows in the same transaction as every insert, update and delete,
-- so the report reads a few thousand rows instead of millions, and stays exact (integers).
CREATE TABLE requests_daily (
    day                      INTEGER NOT NULL,   -- CAST(ts / 86400 AS INTEGER): UTC day number
    model                    TEXT    NOT NULL,   -- requested_model, '' when there was none
    reason                   TEXT    NOT NULL,
    route                    TEXT    NOT NULL,
    failed                   INTEGER NOT NULL,   -- status >= 400
    requests                 INTEGER NOT NULL,
    api_cost_pusd            INTEGER NOT NULL,   -- sums of the known costs
    counterfactual_cost_pusd INTEGER NOT NULL,
    uncosted                 INTEGER NOT NULL,   -- answered, counterfactual unknown
    uncounted                INTEGER NOT NULL,   -- ... and not even its tokens are known
    latency_tax_ms           REAL    NOT NULL,
    taxed                    INTEGER NOT NULL,   -- requests with a latency tax
    PRIMARY KEY (day, model, reason, route, failed)
) WITHOUT ROWID;

INSERT INTO requests_daily
SELECT CAST(ts / 86400 AS INTEGER), COALESCE(requested_model, ''), reason, route, status >= 400,
       COUNT(*), COALESCE(SUM(api_cost_pusd), 0), COALESCE(SUM(counterfactual_cost_pusd), 0),
       SUM(status < 400 AND counterfactual_cost_pusd IS NULL),
       SUM(status < 400 AND counterfactual_cost_pusd IS NULL
           AND counterfactual_prompt_tokens IS NULL),
       TOTAL(latency_tax_ms), SUM(latency_tax_ms > 0)
  FROM requests
 GROUP BY 1, 2, 3, 4, 5;

CREATE TRIGGER requests_daily_insert AFTER INSERT ON requests BEGIN
    INSERT INTO requests_daily VALUES (
        CAST(NEW.ts / 86400 AS INTEGER), COALESCE(NEW.requested_model, ''), NEW.reason,
        NEW.route, NEW.status >= 400, 1, COALESCE(NEW.api_cost_pusd, 0),
        COALESCE(NEW.counterfactual_cost_pusd, 0),
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL,
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL
            AND NEW.counterfactual_prompt_tokens IS NULL,
        NEW.latency_tax_ms, NEW.latency_tax_ms > 0)
    ON CONFLICT (day, model, reason, route, failed) DO UPDATE SET
        requests = requests + 1,
        api_cost_pusd = api_cost_pusd + excluded.api_cost_pusd,
        counterfactual_cost_pusd = counterfactual_cost_pusd + excluded.counterfactual_cost_pusd,
        uncosted = uncosted + excluded.uncosted,
        uncounted = uncounted + excluded.uncounted,
        latency_tax_ms = latency_tax_ms + excluded.latency_tax_ms,
        taxed = taxed + excluded.taxed;
END;

CREATE TRIGGER requests_daily_delete AFTER DELETE ON requests BEGIN
    UPDATE requests_daily SET
        requests = requests - 1,
        api_cost_pusd = api_cost_pusd - COALESCE(OLD.api_cost_pusd, 0),
        counterfactual_cost_pusd = counterfactual_cost_pusd
            - COALESCE(OLD.counterfactual_cost_pusd, 0),
        uncosted = uncosted - (OLD.status < 400 AND OLD.counterfactual_cost_pusd IS NULL),
        uncounted = uncounted - (OLD.status < 400 AND OLD.counterfactual_cost_pusd IS NULL
            AND OLD.counterfactual_prompt_tokens IS NULL),
        latency_tax_ms = latency_tax_ms - OLD.latency_tax_ms,
        taxed = taxed - (OLD.latency_tax_ms > 0)
    WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
      AND reason = OLD.reason AND route = OLD.route AND failed = (OLD.status >= 400);
    DELETE FROM requests_daily
     WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
       AND reason = OLD.reason AND route = OLD.route AND failed = (OLD.status >= 400)
       AND requests = 0;
END;

CREATE TRIGGER requests_daily_update AFTER UPDATE OF
    ts, requested_model, reason, route, status, api_cost_pusd, counterfactual_cost_pusd,
    counterfactual_prompt_tokens, latency_tax_ms
ON requests BEGIN
    UPDATE requests_daily SET
        requests = requests - 1,
        api_cost_pusd = api_cost_pusd - COALESCE(OLD.api_cost_pusd, 0),
        counterfactual_cost_pusd = counterfactual_cost_pusd
            - COALESCE(OLD.counterfactual_cost_pusd, 0),
        uncosted = uncosted - (OLD.status < 400 AND OLD.counterfactual_cost_pusd IS NULL),
        uncounted = uncounted - (OLD.status < 400 AND OLD.counterfactual_cost_pusd IS NULL
            AND OLD.counterfactual_prompt_tokens IS NULL),
        latency_tax_ms = latency_tax_ms - OLD.latency_tax_ms,
        taxed = taxed - (OLD.latency_tax_ms > 0)
    WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
      AND reason = OLD.reason AND route = OLD.route AND failed = (OLD.status >= 400);
    INSERT INTO requests_daily VALUES (
        CAST(NEW.ts / 86400 AS INTEGER), COALESCE(NEW.requested_model, ''), NEW.reason,
        NEW.route, NEW.status >= 400, 1, COALESCE(NEW.api_cost_pusd, 0),
        COALESCE(NEW.counterfactual_cost_pusd, 0),
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL,
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL
            AND NEW.counterfactual_prompt_tokens IS NULL,
        NEW.latency_tax_ms, NEW.latency_tax_ms > 0)
    ON CONFLICT (day, model, reason, route, failed) DO UPDATE SET
        requests = requests + 1,
        api_cost_pusd = api_cost_pusd + excluded.api_cost_pusd,
        counterfactual_cost_pusd = counterfactual_cost_pusd + excluded.counterfactual_cost_pusd,
        uncosted = uncosted + excluded.uncosted,
        uncounted = uncounted + excluded.uncounted,
        latency_tax_ms = latency_tax_ms + excluded.latency_tax_ms,
        taxed = taxed + excluded.taxed;
    DELETE FROM requests_daily
     WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
       AND reason = OLD.reason AND route = OLD.route AND failed = (OLD.status >= 400)
       AND requests = 0;
END;
