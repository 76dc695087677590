"""OpenAI's Files and Batch APIs, kept in the ledger database: files with their bytes, batches,
and their lines, which workers claim through the database.

    objects      what the stores hand out (a file, a batch, a line, a line's result) as OpenAI's
                 objects; a batch's statuses and the moves between them; OpenAI's limits
    input_file   a batch's input file read into its lines, or the errors that fail the batch
    files        ``FileStore``: uploads within a per-key byte quota, listed, read (a slice at a
                 time), deleted, swept
    outputs      a batch's end: its output and error files, built from its lines in the
                 client's order; lines cancelled, expired or given up
    records      a batch's and a line's rows read back as objects, and the statements' helpers
    store        ``BatchStore``: batches made, listed, cancelled, expired; lines claimed under a
                 lease, finished once with their ledger row, deferred to the upstream's batch
    handover     the lines waiting for an upstream batch whose worker is gone, taken over by
                 another worker; never a live replica's
    tally        what an operator reads: a batch's money from its lines' ledger rows, the key
                 names of its owners, the open lines by state and batches by status

May import ``proxy.ledger.db``, ``proxy.ledger.pricing``, ``proxy.ledger.writing`` (a line's
ledger row and its values) and the shared ``proxy.errors``.
"""
