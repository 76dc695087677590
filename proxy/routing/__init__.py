"""Routing local answers by predicted finish time (issue 6, seed 000).

    estimator   the predicted finish of a request on a backend, and what it is learned from;
                the ``predicted_slow`` decision (``Predictor``)
    base        what a local backend is to the router (``Backend``, ``Choice``)
    pool        the bundled engine as a backend, and the choice between backends

Remote backends (other llama.cpp servers) live in ``proxy.backends``. ``proxy.router`` asks the
pool for a choice in ``plan`` and runs it in ``try_local``.
"""
