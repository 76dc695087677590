"""Serving: the work the proxy does for its clients beyond one interactive exchange.

    batch_runner    ``BatchRunner``: a long-lived task that claims batch lines from the ledger,
                    runs each local first (the batch's window as its deadline), finishes the
                    accepted ones, and sends the rejects to the upstream's Batch API together;
                    resumes an upstream batch after a restart; ``RunnerGauges``
    batch_lines     what the runner asks of the cascade (``LocalAttempt``: ``Accepted``,
                    ``Rejected``, ``CannotServe``), a line's ledger rows at the batch tier, and
                    the budget's ``Purse`` (``LedgerPurse``)

May import ``proxy.ledger``, ``proxy.upstream``, ``proxy.config``, ``proxy.errors`` and
``proxy.logs``. Knows nothing of Starlette: the cascade hands it its local attempt.
"""
