"""The clients of the proxy: their API keys, budgets and request rates, kept in the ledger.

    keys      the client API keys (``frugal keys``): created, listed, revoked, looked up
    budgets   each key's monthly budget: reservations before a call, spend after it
    rpm       requests per minute per key: a sliding log of the last minute, across replicas

May import ``proxy.ledger.db``, ``proxy.ledger.pricing`` and the shared ``proxy.config`` and
``proxy.errors``.
"""
