-- A client key's scope (issue 24, `frugal keys create NAME --admin`); PostgreSQL's twin is
-- postgres/0010_key_scope.sql.
-- 1: an admin key, which reads every key's figures, /metrics and the full /healthz; 0: a client
-- key, which reads its own figures only. Keys stored before this migration are client keys.
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1));
