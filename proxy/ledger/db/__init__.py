"""The ledger's database, SQLite or PostgreSQL: where it is, its connections, its schema.

    location     where the ledger lives: a SQLite file or a PostgreSQL database, by one URL
    postgres     psycopg, imported only when a PostgreSQL ledger is used
    access       short connections for readers and commands: the same statements on both
    connections  a pool of connections used from worker threads (budgets, rpm, the cache)
    migrate      the migrations runner (``migrations/NNNN_*.sql``, applied in order, recorded)

May import ``proxy.errors`` only: every other part of the ledger stands on this one.
"""
