"""HTTP: the Starlette app, its middleware and one handler per endpoint.

    app          ``create_app(settings)``, assembled from the routes, the lifespan and the
                 middleware; ``/healthz``, ``/v1/models``, ``/openapi.json``
    lifespan     the parts the app starts, in order (ledger, keys, quotas, upstream, engine,
                 router, audits), the ``Services`` and handlers made from them, and their stop
    shutdown     the orderly stop after the drain (ledger flushed first), and its time bound
    services     the typed bundle of services the handlers and middleware receive
    auth         client keys (``Authorization: Bearer``), and the guard that refuses what a web
                 page could send to a keyless proxy (non-JSON bodies, foreign ``Host``)
    limits       body size, header time, concurrency
    disconnect   a client that leaves cancels its handler (and so its local work)
    handler      the life cycle every cascade endpoint shares: plan, local attempt, fallback,
                 answer, exactly one ledger row
    exchange     what one request did, for the headers, the log and the ledger row
    record       the row, the metrics and the log line made from an exchange, once
    shadow       a local attempt offered to the shadow audits; a drawn audit started
    answers      the engine's completion as OpenAI sends it
    chat         ``POST /v1/chat/completions``: the cascade as HTTP
    completions  ``POST /v1/completions`` and ``POST /v1/embeddings``
    responses    ``POST /v1/responses``: translated to chat (responses_translate), answered by
                 the cascade, sent as a Responses object or its typed events; its nested
                 shapes and their checks are responses_shapes
    responses_state  stored Responses: ``store``, ``previous_response_id``, and
                 ``GET``/``DELETE /v1/responses/{id}`` and its ``input_items``
    sse          Server-Sent Events: chunks, the response that writes a stream's row once
    validate     cheap validation of request bodies (OpenAI's shapes), errors naming ``param``
    body_check   a large body parsed and checked in a worker thread, off the event loop,
                 within a time bound (check_progress: the field its check was on)
    openapi      the OpenAPI description served at ``/openapi.json``
    metrics      ``/metrics`` (Prometheus)
    report       ``GET /v1/frugal/report``: ``frugal report --format json`` over HTTP
    dashboard    ``GET /dashboard``: the savings page, its scripts and chart library (static/)

May import every other room: ``proxy.routing``, ``proxy.upstream``, ``proxy.audit``,
``proxy.engine`` (the handle the lifespan starts), ``proxy.ledger`` and the shared modules.
Nothing imports ``proxy.http`` except ``proxy.cli``.
"""
