"""Fair shares between client keys: each key's part of the server's concurrency, and its rpm,
applied from the headers, before a byte of the body is read.

``[server] max_concurrency`` bounds the requests in flight on the server (:mod:`proxy.server.
limits`); without more, one key could take all of them, for instance with connections that send
their headers and then a body a byte at a time, and every other key would get 429s. So each key
also has a share of its own:

- ``frugal keys create NAME --max-concurrency N`` (stored with the key), or
  ``name;max_concurrency=N:key`` for a key of ``[server] api_keys_env``;
- otherwise ``[server] max_concurrency_per_key``, whose default (0) is a quarter of
  ``max_concurrency``, at least 1;
- and never more than ``max_concurrency`` - 1 (:meth:`ServerSettings.key_concurrency`): one key
  can never hold every slot. (With ``max_concurrency = 1`` a key holds the only one.)

A request of a key that holds its share gets OpenAI's 429 (``rate_limit_exceeded``, with
``Retry-After``) at once, without waiting for its body; when a body was still to come, the
response closes the connection, so the refused request holds nothing after it. Then, still before
the body, the key's ``rpm`` is counted on the endpoints that serve models (``admit_rate`` of
:mod:`proxy.serving.quotas`): a key past it gets its 429 the same way. Only then does the request
take a slot of ``max_concurrency``. The key's checks that need the body (its models, its budget)
stay in the handlers.

A key is its identity here (:attr:`~proxy.ledger.tenants.keys.ClientKey.identity`), not its name.
Shares are counted in this process: with replicas, each one holds a key to its share. Keyless mode
(no keys configured) has no shares: its one user may use every slot. ``/healthz`` and
``/metrics`` are neither counted nor refused, as in :mod:`proxy.server.limits`.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.config import ServerSettings
from proxy.errors import ProxyError, TooManyRequests
from proxy.ledger.tenants.keys import ClientKey
from proxy.server.limits import UNLIMITED_PATHS, body_pending
from proxy.server.lookup import services_in
from proxy.server.render import render

log = structlog.get_logger("frugal.limits")


class KeyShares:
    """Requests in flight per key identity; only keys with some in flight have an entry."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: dict[str, int] = {}

    def take(self, owner: str, limit: int) -> bool:
        """One more for ``owner``, if it holds fewer than ``limit``."""
        count = self.held.get(owner, 0)
        if count >= limit:
            return False
        self.held[owner] = count + 1
        return True

    def give_back(self, owner: str) -> None:
        count = self.held.get(owner, 0) - 1
        if count > 0:
            self.held[owner] = count
        else:
            self.held.pop(owner, None)


class KeyShareMiddleware:
    """Between authentication and the server's concurrency limit: the key's share, then its
    rpm on ``rate_paths`` (the endpoints that serve models)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        shares: KeyShares,
        rate_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.server = settings
        self.shares = shares
        self.rate_paths = frozenset(rate_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = scope.get("state", {}).get("client_key") if scope["type"] == "http" else None
        if not isinstance(key, ClientKey) or scope.get("path") in UNLIMITED_PATHS:
            await self.app(scope, receive, send)  # keyless, or an open path without a key
            return
        limit = self.server.key_concurrency(key.max_concurrency)
        close = {"connection": "close"} if body_pending(scope) else {}
        if not self.shares.take(key.identity, limit):
            busy = TooManyRequests(
                f"the key {key.name!r} holds its share of this proxy's "
                f"{self.server.max_concurrency} slots ({limit} in flight at once: frugal keys "
                "create --max-concurrency, [server] max_concurrency_per_key); retry when one "
                "of its requests has finished",
                headers=close,
            )
            await _refuse(scope, receive, send, busy, "key_share")
            return
        held = True

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                self.shares.give_back(key.identity)

        async def send_then_free(message: Message) -> None:
            # The slot is free before the last byte goes out: a client that sends its next
            # request as soon as it has read this answer must find it free.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                give_back()
            await send(message)

        try:
            services = services_in(scope)
            if scope.get("path") in self.rate_paths and services and services.quotas:
                try:
                    await services.quotas.admit_rate(key, close)
                except TooManyRequests as limited:
                    await _refuse(scope, receive, send, limited, "key_rpm")
                    return
            await self.app(scope, receive, send_then_free)
        finally:
            give_back()


async def _refuse(scope: Scope, receive: Receive, send: Send, error: ProxyError, why: str) -> None:
    state = scope.get("state", {})
    services = services_in(scope)
    if services is not None:
        services.metrics.rejected(why)
    log.info(
        "rejected",
        request_id=state.get("request_id"),
        key=state.get("key_name"),
        method=scope.get("method"),
        path=str(scope.get("path", ""))[:100],
        status=error.status,
        reason=why,
    )
    await render(error, state.get("request_id"))(scope, receive, send)
