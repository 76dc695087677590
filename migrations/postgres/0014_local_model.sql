-- Names a client can rely on (as ../0014_local_model.sql): the model the local attempt ran.
ALTER TABLE requests ADD COLUMN local_model TEXT;
