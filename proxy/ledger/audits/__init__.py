"""The shadow audits as the ledger keeps them, and what they say about the gate.

    table          the ``audits`` table (``migrations/0007_audits.sql``): its columns, its
                   insert through the one writer, its readers (spend, the audits of a period)
    audit_record   ``AuditRecord``: one audit as a row of that table, and back
    estimate       precision of accepted answers with a 95% Wilson interval over weighted
                   counts, acceptance rate, the share of rejected answers that were right
    threshold      the lowest threshold whose precision, at the lower end of its interval,
                   reaches ``[quality] target_precision``

Pure but for ``table``. May import ``proxy.ledger.db`` and the shared ``proxy.errors``.
"""
