-- Names a client can rely on (issue 42): a local answer's `model` is the model the client asked
-- for, so the model that really answered is kept here. PostgreSQL's twin is
-- postgres/0014_local_model.sql.

-- The model the local attempt ran: the GGUF file's name for the bundled engine, or the model a
-- [[local.backends]] server reported. Set whenever the local model answered, whether the gate
-- kept its answer or not; NULL when it was not asked, or failed before it answered. Rows
-- written before this migration have NULL.
ALTER TABLE requests ADD COLUMN local_model TEXT;
