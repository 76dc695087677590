"""Routing: which backend answers a request, and whether its local answer is good enough.

    router        the cascade policy: ``plan`` (forced, unsupported, context overflow,
                  predicted too slow, or a local attempt) and ``try_local`` (accepted, low
                  quality, ...)
    reasons       the one list of routing reasons (``Reason``), the ``x-frugal-reason`` values
    servable      which requests the local engine can serve at all (``local_blocker``)
    prerouter     from the request alone, will the local answer be rejected
                  (``predicted_reject``), learned from the audits' verdicts
    estimator     the predicted finish of a request on a backend, and what it is learned from;
                  the ``predicted_slow`` decision (``Predictor``), finish-time routing
    prefix_memory the share of a prompt a backend has probably cached (``PrefixMemory``)
    base          what a local backend is to the router (``Backend``, ``Choice``)
    pool          the bundled engine as a backend, and the choice between backends
    remote        other llama.cpp / OpenAI-compatible servers used as local backends: their
                  life cycle, prediction, and one call with its deadline
    remote_probe  a remote server's health probes: when it is up, marked down, and up again
    remote_wire   what a remote server is sent, and how its answer is read (one bounded POST)
    remote_stream a live stream from a remote server: relayed token by token, put together
    remote_kinds  what each kind of server (llama-server, llama-cpp-python, vLLM, ...) is sent
                  and refuses
    remote_rates  a remote server's prefill and decode rates, measured from its answers
    remote_load   the load a remote server publishes (running and waiting requests, every
                  client's), kept current while it is in use, and counted in its prediction
    remote_health whether a remote server answers rightly (JSON, the model it lists)
    slots         a remote server's places to run and the FIFO waiting for them

May import: ``proxy.engine``, ``quality``, and the shared ``proxy.protocol.params``,
``proxy.config``, ``proxy.errors``, ``proxy.ledger``. Never ``proxy.server`` or ``proxy.serving``
(the router knows nothing of HTTP) nor ``proxy.upstream`` (the fallback is the handler's business).
"""
