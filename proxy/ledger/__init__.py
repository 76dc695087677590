"""What happened and what it cost: the ledger database and everything that reads it.

    db/        the database, SQLite or PostgreSQL: where it is, its connections, migrations
    writing/   the one writer thread: a row per request, batched off the request path, spilled
               rather than lost
    reports/   ``frugal report``: the queries, the period put together, its formats, the chart
    tenants/   the client keys, their monthly budgets and requests per minute
    pricing    prices (litellm's offline map plus overrides) and a row's costs, in pico-dollars
    audits     the ``audits`` table: its columns, its insert, its readers
    response_cache  answers to deterministic requests, kept in the ledger database
    responses_store stored Responses (``store``), their input items and their chains
    response_outputs the answers stored responses share: split off, digested, joined back
    batches/   OpenAI's Files and Batch APIs: files within a per-key quota, batches, and their
               lines, claimed by workers through the database and billed once each

May import the shared ``proxy.config``, ``proxy.errors``, ``proxy.protocol.params`` (the local alias
the prices know) and ``proxy.logs`` only: every other room writes to the ledger, so the
ledger imports none of them.
"""
