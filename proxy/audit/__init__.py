"""Shadow audits: how often an accepted local answer is in fact right, measured on live traffic.

The room holds the parts of issue 17 that need no HTTP server, in the order an audit runs:

    settings    ``[audit]``: rate, monthly budget, judge model, notion of correctness, queue size
    sampler     whether this local attempt is audited (at ``rate``, accepted and rejected alike),
                its sampling weight, the bounded queue of pending audits, the monthly budget
    verdict     the cheap exact check (same text, number, JSON or label) that settles an audit
                without a judge; reading an answer's text out of a completion
    judge       the judge protocol of ``docs/audit.md``: the request body, the reading of its
                answer; any failure is "no verdict", never "correct"
    record      one audit as a row of the ``audits`` table (``migrations/0007_audits.sql``),
                and reading them back
    estimate    precision of accepted answers with a 95% Wilson interval over weighted counts,
                acceptance rate, the share of rejected answers that were right; overall, per
                task kind, per requested model
    threshold   the lowest threshold whose precision, at the lower end of its interval, reaches
                ``[quality] target_precision``

It may import :mod:`proxy.config` types, :mod:`proxy.errors` and :mod:`quality`; never
``proxy.http`` (or any other part of the request path), which calls into it: the router offers
each local attempt to a :class:`~proxy.audit.sampler.Sampler`, and the upstream client is
plugged into :func:`~proxy.audit.judge.ask_judge` as its transport.
"""
