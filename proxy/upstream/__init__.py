"""The paid API: the fallback client, its streams, and the one translation of foreign errors.

    client          ``Upstream``: picks the route of a request's model, and does for every
                    route the allow-list of forwarded parameters, the retries, the attempts
                    counted and the stream; ``KINDS``, the routes it ships
    route           ``Route``, what a way to the API is (one attempt of a chat, plain or
                    streamed), and ``Kinds``, which provider prefix takes which route
    direct_route    the direct route: an OpenAI-compatible ``api_base`` over aiohttp
    litellm_route   the litellm route: its keywords (allow-listed, none of litellm's own from
                    a client) and one attempt of its call
    litellm_clients the bounded clients that route hands litellm (``client=``), by provider,
                    so that an answer is read only up to ``[fallback] max_answer_bytes``
    retry           ``RetryPolicy`` (tenacity): what is retried, backoff, ``Retry-After``, the
                    time budget; retries live here and nowhere else
    stream          an upstream SSE stream that has started: relayed event by event, usage noted
    responses_api   the upstream's own ``/v1/responses`` (direct route): the body it is sent
                    (``store: false``, the whole conversation, none of our ids), its usage
    model_list      ``ModelList``: the upstream's own ``GET /models``, for ``/v1/models``,
                    cached and bounded in time, bytes and ids
    batch_api       ``BatchAPI``: the upstream's own Files and Batch APIs (one JSONL file, one
                    batch, polled, its output and error files read back, bounded)
    litellm_batches the Batch API wire of a litellm provider whose Files and Batch APIs are
                    OpenAI's (``BATCH_PROVIDERS``), at litellm's base and key for it
    deferred        ``Deferred``: lines that can wait sent by ``[batch] fallback`` (``batch``,
                    ``flex`` or ``sync``), one outcome back: answers and the unanswered
    failures        ``translate``: every aiohttp, litellm or status failure becomes a
                    ``ProxyError`` here, once

May import ``proxy.protocol.params``, ``proxy.config``, ``proxy.errors`` and ``proxy.logs``. Knows
nothing of HTTP handlers, routing or the engine.
"""
