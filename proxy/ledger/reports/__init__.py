"""Reading the ledger back: ``frugal report`` and ``GET /v1/frugal/report``.

    build       the period, its fixed cost, the report put together
    rollup      the report's queries: totals, savings, latency tax, by model / day / key / reason
    budget_use  each client key's monthly budget and its use, for ``--by key``
    formats     the report's output: table, markdown, CSV and JSON
    chart       ``frugal report --chart``
    audit_quality  the report's quality section: what the period's audits say

May import ``proxy.ledger.db``, ``proxy.ledger.pricing``, ``proxy.ledger.audits`` and the shared
``proxy.errors``.
"""
