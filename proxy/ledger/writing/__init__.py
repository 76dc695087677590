"""Writing the ledger: one row per request, off the request path, never lost silently.

    writer     ``Ledger``: the one writer thread, batched inserts, WAL, flushed on shutdown
    batching   the writer thread's loop: gathers batches, winds up at shutdown
    flush      its writes: one transaction a batch, rows held, retried, rejected or spilled
    storage    the writer thread's one connection and its statements
    ledger_row ``LedgerRow``: the ``requests`` table's columns, once
    rows       a request's row turned into the values of the ``requests`` table
    usage      the impossible token counts and costs of a row, blanked to unknown
    spill      rows the database would not take, kept in a JSONL file
    tokens     counterfactual token counts, on a thread of their own

May import ``proxy.ledger.db``, ``proxy.ledger.pricing``, ``proxy.ledger.audits.table`` and the
shared ``proxy.config``, ``proxy.errors`` and ``proxy.logs``.
"""
