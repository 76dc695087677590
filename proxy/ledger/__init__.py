"""What happened and what it cost: the ledger database and everything that reads it.

    writer    the one writer thread: batched inserts off the request path, WAL, flushed on
              shutdown, failed rows isolated and spilled, never lost silently
    batching  the writer thread's loop: gathers batches, winds up at shutdown
    flush     its writes: one transaction a batch, rows held, retried, rejected or spilled
    migrate   the migrations runner (``migrations/NNNN_*.sql``, applied in order, recorded)
    pricing   prices (litellm's offline map plus overrides) and a row's costs, in pico-dollars
    usage     the impossible token counts and costs of a row, blanked to unknown
    tokens    counterfactual token counts, on a thread of their own
    report    ``frugal report``: the period, its fixed cost, the report put together
    rollup    the report's queries: totals, savings, latency tax, by model / day / key / reason
    chart     ``frugal report --chart``
    keys      the client API keys kept in the ledger database

May import ``proxy.config`` and ``proxy.errors`` only: every other room writes to the ledger,
so the ledger imports none of them.
"""
