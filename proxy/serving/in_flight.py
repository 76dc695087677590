"""The count of requests being handled now: the limits middleware (:mod:`proxy.server.limits`)
raises and lowers it, the metrics read it when Prometheus scrapes."""

from __future__ import annotations


class InFlight:
    """Requests being handled now (the limited ones); read by the metrics at scrape time."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0
