-- The client key in the daily rollup (as ../0005_key_rollup.sql): the table is rebuilt with
-- key_name in its primary key and summed again from `requests`; the trigger function is
-- replaced; the triggers stay.
DROP TABLE requests_daily;

CREATE TABLE requests_daily (
    day                      BIGINT           NOT NULL,  -- floor(ts / 86400): UTC day number
    model                    TEXT             NOT NULL,
    key_name                 TEXT             NOT NULL,  -- '' when there was none
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
    PRIMARY KEY (day, model, key_name, reason, route, failed)
);

INSERT INTO requests_daily
SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), COALESCE(key_name, ''),
       reason, route, (status >= 400)::int, count(*), COALESCE(sum(api_cost_pusd), 0)::bigint,
       COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
       count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
       count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                        AND counterfactual_prompt_tokens IS NULL),
       COALESCE(sum(latency_tax_ms), 0), count(*) FILTER (WHERE latency_tax_ms > 0)
  FROM requests
 GROUP BY 1, 2, 3, 4, 5, 6;

-- Keeps requests_daily equal to the sum of the rows: one grouped upsert per statement, over
-- the statement's transition tables (old_rows taken away, new_rows added), in key order.
CREATE OR REPLACE FUNCTION requests_daily_sync() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO requests_daily AS d
        SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), COALESCE(key_name, ''), reason, route, (status >= 400)::int,
               -count(*), -COALESCE(sum(api_cost_pusd), 0)::bigint,
               -COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
               -count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
               -count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                                  AND counterfactual_prompt_tokens IS NULL),
               -COALESCE(sum(latency_tax_ms), 0),
               -count(*) FILTER (WHERE latency_tax_ms > 0)
          FROM old_rows
         GROUP BY 1, 2, 3, 4, 5, 6
         ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (day, model, key_name, reason, route, failed) DO UPDATE SET
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
           AND (day, model, key_name, reason, route, failed) IN (SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), COALESCE(key_name, ''), reason, route, (status >= 400)::int FROM old_rows);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO requests_daily AS d
        SELECT floor(ts / 86400)::bigint, COALESCE(requested_model, ''), COALESCE(key_name, ''), reason, route, (status >= 400)::int,
               count(*), COALESCE(sum(api_cost_pusd), 0)::bigint,
               COALESCE(sum(counterfactual_cost_pusd), 0)::bigint,
               count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL),
               count(*) FILTER (WHERE status < 400 AND counterfactual_cost_pusd IS NULL
                                  AND counterfactual_prompt_tokens IS NULL),
               COALESCE(sum(latency_tax_ms), 0),
               count(*) FILTER (WHERE latency_tax_ms > 0)
          FROM new_rows
         GROUP BY 1, 2, 3, 4, 5, 6
         ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (day, model, key_name, reason, route, failed) DO UPDATE SET
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
