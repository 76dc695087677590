"""What happened and what it cost: the ledger database and everything that reads it.

    writer    the one writer thread: batched inserts off the request path, WAL, flushed on
              shutdown, failed rows isolated and spilled, never lost silently
    migrate   the migrations runner (``migrations/NNNN_*.sql``, applied in order, recorded)
    pricing   prices (litellm's offline map plus overrides) and token counts, in pico-dollars
    report    ``frugal report``: totals, savings, latency tax, by model / day / key / reason
    chart     ``frugal report --chart``
    keys      the client API keys kept in the ledger database

May import ``proxy.config`` and ``proxy.errors`` only: every other room writes to the ledger,
so the ledger imports none of them.
"""
