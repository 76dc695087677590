-- Per-key budgets and limits, and the response cache (issue 19); PostgreSQL's twin is
-- postgres/0008_budgets_cache.sql. Money is integer pico-dollars (1e-12 USD).

-- What a stored key may do. NULL: no limit of that kind.
ALTER TABLE api_keys ADD COLUMN monthly_budget_pusd INTEGER CHECK (monthly_budget_pusd >= 0);
ALTER TABLE api_keys ADD COLUMN rpm INTEGER CHECK (rpm > 0);
ALTER TABLE api_keys ADD COLUMN models TEXT;  -- comma-separated model names a key may ask for

-- A key's API spend in one UTC month (YYYY-MM), and what requests in flight have reserved.
-- proxy/ledger/tenants/budgets.py reserves with one conditional UPDATE of this row.
CREATE TABLE key_spend (
    key_name      TEXT    NOT NULL,
    month         TEXT    NOT NULL,
    spent_pusd    INTEGER NOT NULL DEFAULT 0,
    reserved_pusd INTEGER NOT NULL DEFAULT 0 CHECK (reserved_pusd >= 0),
    PRIMARY KEY (key_name, month)
);

-- One row per reservation in flight; settled (deleted) when its request ends, or released
-- by the sweep once expires_at has passed (a replica that crashed never settles).
CREATE TABLE budget_reservations (
    id          TEXT    PRIMARY KEY,
    key_name    TEXT    NOT NULL,
    month       TEXT    NOT NULL,
    amount_pusd INTEGER NOT NULL CHECK (amount_pusd >= 0),
    expires_at  REAL    NOT NULL
);
CREATE INDEX budget_reservations_expiry ON budget_reservations (expires_at);

-- The requests of the last minute of each key with an rpm limit (a sliding log).
CREATE TABLE rate_events (
    id       INTEGER PRIMARY KEY,
    key_name TEXT    NOT NULL,
    ts       REAL    NOT NULL
);
CREATE INDEX rate_events_key_ts ON rate_events (key_name, ts);

-- Answers to deterministic requests (temperature 0, or a seed), by a hash of what makes them.
CREATE TABLE response_cache (
    cache_key  TEXT    PRIMARY KEY,
    created_at REAL    NOT NULL,
    expires_at REAL    NOT NULL,
    hits       INTEGER NOT NULL DEFAULT 0,
    answer     TEXT    NOT NULL  -- the public answer, JSON
);
CREATE INDEX response_cache_expiry ON response_cache (expires_at);
CREATE INDEX response_cache_created ON response_cache (created_at);
