"""The paid API: the fallback client, its streams, and the one translation of foreign errors.

    client          ``Upstream``: the direct OpenAI-compatible path (aiohttp) or litellm for
                    other providers; the allow-list of forwarded parameters
    litellm_route   the litellm route: its keywords (allow-listed, none of litellm's own from
                    a client) and one attempt of its call
    retry           ``RetryPolicy`` (tenacity): what is retried, backoff, ``Retry-After``, the
                    time budget; retries live here and nowhere else
    stream          an upstream SSE stream that has started: relayed event by event, usage noted
    failures        ``translate``: every aiohttp, litellm or status failure becomes a
                    ``ProxyError`` here, once

May import ``proxy.params``, ``proxy.config``, ``proxy.errors`` and ``proxy.logs``. Knows
nothing of HTTP handlers, routing or the engine.
"""
