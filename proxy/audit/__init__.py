"""Shadow audits: how often an accepted local answer is in fact right, measured on live traffic.

The room holds the parts of issue 17 that need no HTTP server, in the order an audit runs:

    sampler     whether this local attempt is audited (at ``rate``, accepted and rejected alike),
                its sampling weight, the bounded queue of pending audits, the monthly budget
    verdict     the cheap exact check (same text, number, JSON or label) that settles an audit
                without a judge; reading an answer's text out of a completion
    judge       the judge protocol of ``docs/audit.md``: the request body, the reading of its
                answer; any failure is "no verdict", never "correct"
    runner      the audits' worker: a drawn attempt shadowed, judged and recorded; the threshold
                in force kept up to date from the recorded audits
    refit       ``frugal calibrate``: the gate's combiner refitted on the recorded audits

Its ``[audit]`` settings are a section of :mod:`proxy.config` (``audit_settings``); the audits
as recorded, and the estimates and threshold read from them, are the ledger's
(:mod:`proxy.ledger.audits`).

It may import :mod:`proxy.config` types, :mod:`proxy.errors`, :mod:`proxy.ledger` (the audits
recorded), :mod:`quality`, and below it on the request path :mod:`proxy.routing` (the runner
hands the threshold in force to the ``Router``; the pre-router learns from the audits' request
features) and
:mod:`proxy.upstream` (the shadow and judge calls go through its ``Upstream``); never
``proxy.server`` or ``proxy.serving``, which call into it: a handler offers each local attempt to a
:class:`~proxy.audit.sampler.Sampler`.
"""
