-- The report's facts and the daily rollup (as ../0002_costs.sql).
ALTER TABLE requests ADD COLUMN api_model TEXT;
ALTER TABLE requests ADD COLUMN cached_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN counterfactual_prompt_tokens BIGINT;
ALTER TABLE requests ADD COLUMN counterfactual_completion_tokens BIGINT;
ALTER TABLE requests ADD COLUMN token_source TEXT;
ALTER TABLE requests ADD COLUMN latency_tax_ms DOUBLE PRECISION NOT NULL DEFAULT 0;

UPDATE requests SET latency_tax_ms = local_ms WHERE route = 'api' AND local_ms > 0;
UPDATE requests
   SET counterfactual_prompt_tokens = prompt_tokens,
       counterfactual_completion_tokens = completion_tokens,
       token_source = CASE WHEN route = 'api' THEN 'usage' ELSE 'local' END
 WHERE prompt_tokens IS NOT NULL;

CREATE INDEX requests_tax ON requests (ts, latency_tax_ms) WHERE latency_tax_ms > 0;

CREATE TABLE requests_daily (
    day                      BIGINT           NOT NULL,  -- floor(ts / 86400): UTC day number
    model                    TEXT             NOT NULL,
    reason                   TEXT             NOT NULL,
    route                    TEXT             NOT NULL,
    failed                   INTEGER          NOT NULL,  -- status >= 400
    requests                 BIGINT           NOT NULL,
    api_cost_pusd            BIGINT           NOT NULL,
    counterfactual_cost_pusd BIGINT           NOT NULL,
    uncosted                 BIGINT           NOT NULL,
    uncounted                BIGINT           NOT NULL,
    latency_tax_ms           DOUBLE PRECISION NOT NULL,
    taxed                    BIGINT           NOT NULL,
    PRIMARY KEY (day, model, reason, route, failed)
);

INSERT INTO requests_daily
SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), reason, route,
       (status >= 400)::int, count(*), COALESCE(sum(api_cost_pusd), 0)::bigint,
       COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
       count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
       count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                        AND counterfactual_prompt_tokens IS NULL),
       COALESCE(sum(latency_tax_ms), 0), count(*) FILTER (WHERE latency_tax_ms > 0)
  FROM requests
 GROUP BY 1, 2, 3, 4, 5;

-- Keeps requests_daily equal to the sum of the rows: one grouped upsert per statement, over
-- the statement's transition tables (old_rows taken away, new_rows added), in key order.
CREATE OR REPLACE FUNCTION requests_daily_sync() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO requests_daily AS d
        SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), reason, route, (status >= 400)::int,
               -count(*), -COALESCE(sum(api_cost_pusd), 0)::bigint,
               -COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
               -count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
               -count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                                  AND counterfactual_prompt_tokens IS NULL),
               -COALESCE(sum(latency_tax_ms), 0),
               -count(*) FILTER (WHERE latency_tax_ms > 0)
          FROM old_rows
         GROUP BY 1, 2, 3, 4, 5
         ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (day, model, reason, route, failed) DO UPDATE SET
            requests = d.requests + excluded.requests,
            api_cost_pusd = d.api_cost_pusd + excluded.api_cost_pusd,
            counterfactual_cost_pusd = d.counterfactual_cost_pusd
                + excluded.counterfactual_cost_pusd,
            uncosted = d.uncosted + excluded.uncosted,
            uncounted = d.uncounted + excluded.uncounted,
            latency_tax_ms = d.latency_tax_ms + excluded.latency_tax_ms,
            taxed = d.taxed + excluded.taxed;
        DELETE FROM requests_daily
         WHERE requests = 0
           AND (day, model, reason, route, failed) IN (SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), reason, route, (status >= 400)::int FROM old_rows);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO requests_daily AS d
        SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), reason, route, (status >= 400)::int,
               count(*), COALESCE(sum(api_cost_pusd), 0)::bigint,
               COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
               count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
               count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                                  AND counterfactual_prompt_tokens IS NULL),
               COALESCE(sum(latency_tax_ms), 0),
               count(*) FILTER (WHERE latency_tax_ms > 0)
          FROM new_rows
         GROUP BY 1, 2, 3, 4, 5
         ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (day, model, reason, route, failed) DO UPDATE SET
            requests = d.requests + excluded.requests,
            api_cost_pusd = d.api_cost_pusd + excluded.api_cost_pusd,
            counterfactual_cost_pusd = d.counterfactual_cost_pusd
                + excluded.counterfactual_cost_pusd,
            uncosted = d.uncosted + excluded.uncosted,
            uncounted = d.uncounted + excluded.uncounted,
            latency_tax_ms = d.latency_tax_ms + excluded.latency_tax_ms,
            taxed = d.taxed + excluded.taxed;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER requests_daily_insert AFTER INSERT ON requests
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION requests_daily_sync();
CREATE TRIGGER requests_daily_update AFTER UPDATE ON requests
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION requests_daily_sync();
CREATE TRIGGER requests_daily_delete AFTER DELETE ON requests
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION requests_daily_sync();
