"""``GET /metrics``: the app's metrics (:mod:`proxy.serving.metrics`) in Prometheus text format,
for an admin key, or for anyone with ``[server] metrics_open``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import Forbidden
from proxy.server.lookup import services_of
from proxy.serving.clients import sees_everything


async def endpoint(request: Request) -> Response:
    """The scrape. With keys, only an admin key reads it, unless ``[server] metrics_open`` (then
    anyone, key or not): its figures are the whole server's, every key's traffic together."""
    services = services_of(request)
    if not services.settings.server.metrics_open and not sees_everything(request.scope):
        raise Forbidden(
            "Reading /metrics needs an admin key of this proxy (frugal keys create NAME "
            "--admin), or [server] metrics_open = true for a scraper without a key."
        )
    metrics = services.metrics
    await metrics.fresh()  # the deferred work's counts, read at most every few seconds
    return Response(metrics.render(), headers={"content-type": CONTENT_TYPE_LATEST})
