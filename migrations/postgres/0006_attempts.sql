-- Hardening (as ../0006_attempts.sql): upstream calls per request, and impossible usage.
ALTER TABLE requests ADD COLUMN upstream_attempts INTEGER;
ALTER TABLE requests ADD COLUMN usage_invalid TEXT;
