-- The client key in the daily rollup, so that `frugal report --by key` reads requests_daily like
-- every other grouping instead of scanning the period's rows (4.5 s over a million rows, against
-- about 1 s for the others; bench/README.md, "Ledger and report").
--
-- key_name becomes a column of requests_daily and part of its primary key, rather than a second
-- rollup table keyed by (day, key_name, reason, route, failed):
-- - a written row still costs one upsert in the writer's transaction; a second table would add
--   a second upsert to every insert and a second set of three triggers to keep in step;
-- - every grouping and the totals read the same rollup rows, so `--by key`, `--by model` and
--   the plain report add up to the same figures by construction, and the sums stay defined in
--   one place;
-- - the cost: one rollup row per key where there was one for all keys (a handful of keys is a
--   handful of times a few thousand rows a month, still nothing next to the rows themselves).
-- SQLite cannot add a column to a primary key, so the table is rebuilt. The old rollup has no
-- key to copy, so the new one is summed again from `requests`, with exactly 0002's sums, in the
-- same transaction as the rest of this migration; the three triggers are recreated with the key.

DROP TRIGGER requests_daily_insert;
DROP TRIGGER requests_daily_update;
DROP TRIGGER requests_daily_delete;
DROP TABLE requests_daily;

-- Per UTC day, model, client key, reason, route and outcome: the sums `frugal report` shows.
CREATE TABLE requests_daily (
    day                      INTEGER NOT NULL,   -- CAST(ts / 86400 AS INTEGER): UTC day number
    model                    TEXT    NOT NULL,   -- requested_model, '' when there was none
    key_name                 TEXT    NOT NULL,   -- the client key's name, '' when there was none
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
    PRIMARY KEY (day, model, key_name, reason, route, failed)
) WITHOUT ROWID;

INSERT INTO requests_daily
SELECT CAST(ts / 86400 AS INTEGER), COALESCE(requested_model, ''), COALESCE(key_name, ''),
       reason, route, status >= 400,
       COUNT(*), COALESCE(SUM(api_cost_pusd), 0), COALESCE(SUM(counterfactual_cost_pusd), 0),
       SUM(status < 400 AND counterfactual_cost_pusd IS NULL),
       SUM(status < 400 AND counterfactual_cost_pusd IS NULL
           AND counterfactual_prompt_tokens IS NULL),
       TOTAL(latency_tax_ms), SUM(latency_tax_ms > 0)
  FROM requests
 GROUP BY 1, 2, 3, 4, 5, 6;

CREATE TRIGGER requests_daily_insert AFTER INSERT ON requests BEGIN
    INSERT INTO requests_daily VALUES (
        CAST(NEW.ts / 86400 AS INTEGER), COALESCE(NEW.requested_model, ''),
        COALESCE(NEW.key_name, ''), NEW.reason, NEW.route, NEW.status >= 400, 1,
        COALESCE(NEW.api_cost_pusd, 0), COALESCE(NEW.counterfactual_cost_pusd, 0),
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL,
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL
            AND NEW.counterfactual_prompt_tokens IS NULL,
        NEW.latency_tax_ms, NEW.latency_tax_ms > 0)
    ON CONFLICT (day, model, key_name, reason, route, failed) DO UPDATE SET
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
      AND key_name = COALESCE(OLD.key_name, '') AND reason = OLD.reason AND route = OLD.route
      AND failed = (OLD.status >= 400);
    DELETE FROM requests_daily
     WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
       AND key_name = COALESCE(OLD.key_name, '') AND reason = OLD.reason AND route = OLD.route
       AND failed = (OLD.status >= 400) AND requests = 0;
END;

-- The writer updates a row when its counterfactual count arrives late; the key is in the list
-- so that a row moved to another key (by hand) moves in the rollup too.
CREATE TRIGGER requests_daily_update AFTER UPDATE OF
    ts, requested_model, key_name, reason, route, status, api_cost_pusd,
    counterfactual_cost_pusd, counterfactual_prompt_tokens, latency_tax_ms
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
      AND key_name = COALESCE(OLD.key_name, '') AND reason = OLD.reason AND route = OLD.route
      AND failed = (OLD.status >= 400);
    INSERT INTO requests_daily VALUES (
        CAST(NEW.ts / 86400 AS INTEGER), COALESCE(NEW.requested_model, ''),
        COALESCE(NEW.key_name, ''), NEW.reason, NEW.route, NEW.status >= 400, 1,
        COALESCE(NEW.api_cost_pusd, 0), COALESCE(NEW.counterfactual_cost_pusd, 0),
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL,
        NEW.status < 400 AND NEW.counterfactual_cost_pusd IS NULL
            AND NEW.counterfactual_prompt_tokens IS NULL,
        NEW.latency_tax_ms, NEW.latency_tax_ms > 0)
    ON CONFLICT (day, model, key_name, reason, route, failed) DO UPDATE SET
        requests = requests + 1,
        api_cost_pusd = api_cost_pusd + excluded.api_cost_pusd,
        counterfactual_cost_pusd = counterfactual_cost_pusd + excluded.counterfactual_cost_pusd,
        uncosted = uncosted + excluded.uncosted,
        uncounted = uncounted + excluded.uncounted,
        latency_tax_ms = latency_tax_ms + excluded.latency_tax_ms,
        taxed = taxed + excluded.taxed;
    DELETE FROM requests_daily
     WHERE day = CAST(OLD.ts / 86400 AS INTEGER) AND model = COALESCE(OLD.requested_model, '')
       AND key_name = COALESCE(OLD.key_name, '') AND reason = OLD.reason AND route = OLD.route
       AND failed = (OLD.status >= 400) AND requests = 0;
END;
