"""Client authentication: who may use the proxy, and refusing to run open on a public address.

With keys configured (:mod:`proxy.keys`: the environment, or the database), every request
needs one, sent as ``Authorization: Bearer KEY`` (what the ``openai`` client sends) or as
``x-api-key: KEY``. A missing or wrong key gets OpenAI's 401. The key is hashed and compared
with every known digest through ``hmac.compare_digest``, so the time taken does not say how much
of a guess was right. A good key's *name* goes into the request's scope state (``key_name``),
whence the ledger, the metrics and the log line take it; the key itself goes nowhere, and in
particular never upstream (the upstream client sends its own key).

Open paths: ``/healthz`` always (a load balancer's health check carries no key; without one it
answers only its status), and ``/metrics`` when ``[server] metrics_open`` is set.

Stored keys are re-read every :data:`REFRESH_S` seconds, so ``frugal keys create`` and
``revoke`` take effect on a running server within that time. Keys are "configured" once the
database has ever held one, revoked or not: revoking the last key locks the proxy, it does not
open it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
from typing import Any

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import keys as keys_mod
from proxy.config import Settings
from proxy.errors import ConfigError, Unauthorized

log = structlog.get_logger("frugal.auth")

REFRESH_S = 2.0
OPEN_PATHS = frozenset({"/healthz"})
_NO_MATCH = bytes(32)


class Authenticator:
    """The keys a running server accepts: the environment's, plus the database's, refreshed."""

    def __init__(self, settings: Settings) -> None:
        self._env = keys_mod.env_keys(settings.server.api_keys_env)
        self._db_path = settings.ledger.path
        self._stored: list[keys_mod.ClientKey] = []
        self._ever_stored = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._env) or self._ever_stored > 0

    async def start(self) -> None:
        """Read the stored keys (the ledger has created the table), then keep them fresh."""
        await self.refresh()
        self._task = asyncio.create_task(self._refresher(), name="keys-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self) -> None:
        try:
            stored, ever = await asyncio.to_thread(keys_mod.load_active, self._db_path)
        except Exception as exc:  # noqa: BLE001 - keep the last good set and say so
            log.warning("keys_refresh_failed", error=type(exc).__name__)
            return
        self._stored, self._ever_stored = stored, max(ever, self._ever_stored)

    async def _refresher(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.refresh()

    def name_of(self, presented: str | None) -> str | None:
        """The name of the key ``presented``, or None. Every known digest is compared."""
        candidate = keys_mod.digest(presented) if presented else _NO_MATCH
        found: str | None = None
        for key in (*self._env, *self._stored):
            if hmac.compare_digest(candidate, key.digest) and presented:
                found = key.name
        return found


def presented_key(scope: Scope) -> str | None:
    """The key in ``Authorization: Bearer …`` or, failing that, in ``x-api-key``."""
    bearer = other = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
        elif name == b"x-api-key" and value.strip():
            other = value.decode("latin-1").strip()
    return bearer or other


class AuthMiddleware:
    """401s requests without a good key (when keys are configured); names the key otherwise.

    ``state`` is the app's state: the :class:`Authenticator` (``state.auth``) is made in the
    lifespan, before any request is served.
    """

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        auth: Authenticator | None = getattr(self.state, "auth", None)
        if auth is None or not auth.enabled:
            await self.app(scope, receive, send)
            return
        name = auth.name_of(presented_key(scope))
        scope_state = scope.setdefault("state", {})
        scope_state["authenticated"] = name is not None
        if name is not None:
            scope_state["key_name"] = name
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in OPEN_PATHS or (path == "/metrics" and self.state.settings.server.metrics_open):
            await self.app(scope, receive, send)
            return
        has_key = presented_key(scope) is not None
        error = Unauthorized(
            "Incorrect API key provided. Send a key of this proxy as "
            "'Authorization: Bearer KEY' (frugal keys create NAME makes one)."
            if has_key
            else "You didn't provide an API key. Send a key of this proxy as "
            "'Authorization: Bearer KEY'.",
        )
        log.info(
            "rejected",
            request_id=scope_state.get("request_id"),
            method=scope.get("method"),
            path=path[:100],
            status=401,
            reason="wrong_key" if has_key else "no_key",
        )
        metrics = getattr(self.state, "metrics", None)
        if metrics is not None:
            metrics.rejected("unauthorized")
        await send_error(send, error.status, error.body(), {b"www-authenticate": b"Bearer"})


async def send_error(
    send: Send, status: int, body: dict[str, Any], headers: dict[bytes, bytes] | None = None
) -> None:
    """An OpenAI-shaped error straight from a middleware (no app, no exception handler)."""
    payload = json.dumps(body).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *(headers or {}).items(),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


# -- the bind check ---------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything, so treat it as public


def check_bind(settings: Settings, *, insecure_public: bool = False) -> bool:
    """Refuse a public address with no keys; returns whether keys are configured.

    Parses the environment's keys (a bad entry is a :class:`ConfigError` here, at start-up,
    rather than a 401 for everyone later).
    """
    server = settings.server
    configured = bool(keys_mod.env_keys(server.api_keys_env)) or (
        keys_mod.stored_count(settings.ledger.path) > 0
    )
    if configured or is_loopback(server.host):
        return configured
    if insecure_public or server.allow_public_without_keys:
        log.warning(
            "public_without_keys",
            host=server.host,
            detail="anyone who can reach this port can use the proxy and spend the API budget",
        )
        return configured
    env = f"${server.api_keys_env}" if server.api_keys_env else "[server] api_keys_env"
    raise ConfigError(
        f"[server] host = {server.host!r} is not a loopback address and no client keys are "
        "configured, so anyone who can reach the port could use the proxy and spend your API "
        f"budget. Create a key with `frugal keys create NAME` or put keys in {env}; or listen "
        'on host = "127.0.0.1" behind a TLS proxy; or, if something in front already keeps '
        "strangers out, set [server] allow_public_without_keys = true (or pass "
        "--insecure-public)."
    )
