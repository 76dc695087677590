"""Client authentication: who may use the proxy, and refusing to run open on a public address.

With keys configured (:mod:`proxy.ledger.tenants.keys`: the environment, or the database), every
request needs one, sent as ``Authorization: Bearer KEY`` (what the ``openai`` client sends) or as
``x-api-key: KEY``. A missing or wrong key gets OpenAI's 401. The key is hashed and compared
with every known digest through ``hmac.compare_digest``, so the time taken does not say how much
of a guess was right. A good key's *name* goes into the request's scope state (``key_name``),
whence the ledger, the metrics and the log line take it, and its record (``client_key``: its
limits and its identity, never the key) for :mod:`proxy.server.shares`; the key itself goes
nowhere, and in particular never upstream (the upstream client sends its own key).

All of this is read from the headers alone, before a byte of the body: a request without a good
key gets its 401 before it takes a slot of ``[server] max_concurrency`` or of its key's share,
and when its body is still to come the 401 closes the connection, so it holds nothing after.

Scopes: a good key's scope goes into the state too (``admin``: True for an admin key, False for
a client key and for a request without a key on an open path; absent in keyless mode, where
everything is visible). :func:`proxy.serving.clients.own_key` tells a handler whose figures a
request may read: ``/v1/frugal/report`` (and so the dashboard) counts a client key's own requests
only, ``/healthz`` sends it only the status, and ``/metrics`` refuses it with a 403 unless
``[server] metrics_open``.

Open paths: ``/healthz`` always (a load balancer's health check carries no key; without one it
answers only its status), ``/metrics`` when ``[server] metrics_open`` is set, and the dashboard's
page and files (``/dashboard``, ``/dashboard/*``: they hold no data; the page sends the key with
each data call it makes).

Stored keys are re-read every :data:`REFRESH_S` seconds (1 s), so ``frugal keys create`` and
``revoke`` take effect on a running server, and on every replica sharing a PostgreSQL ledger,
within that time plus one read (2 s at most on a responsive database). Their limits (budget,
rpm, models; :mod:`proxy.serving.quotas`) come with them. Keys are "configured" once the
database has ever held one, revoked or not: revoking the last key locks the proxy, it does not
open it.

Failing closed: when the stored keys cannot be read at start (a damaged or locked database),
``frugal serve`` stops with a config error (:func:`check_bind`), and an
:class:`~proxy.serving.clients.Authenticator`
that still cannot read them counts as "keys configured, none known": every request needs a key
and only the environment's keys match, until a later read succeeds. A read that fails later
keeps the last keys read. Nothing turns authentication off once it was on.

Keyless mode (no key configured, a loopback bind) trusts whoever can reach the port, and a web
page in the operator's browser can reach a loopback port too. :class:`RequestGuard` stops it:

- a POST must say ``Content-Type: application/json`` (parameters such as ``charset`` allowed),
  else a 415. A page can send a cross-origin POST without asking first only with a "simple"
  content type (``text/plain``, a form); ``application/json`` makes the browser ask (CORS
  preflight), and this proxy never says yes. The rule holds with keys too: OpenAI's SDKs always
  send it, and one rule for both modes means a client that works against a keyless proxy on a
  laptop works against the keyed one in production.
- in keyless mode on a loopback bind, the ``Host`` header must name a loopback address
  (``localhost``, ``127.x.x.x``, ``[::1]``, any port) or the configured ``[server] host``, else
  a 421, on every method: a page that rebinds its own host name to 127.0.0.1 (DNS rebinding)
  sends its own name as ``Host``. A request without ``Host`` (HTTP/1.0) is let through: browsers
  always send one. With keys, a page has no key to send, so the header is not checked (a TLS
  proxy in front forwards the public name).
- ``POST /v1/files`` is a form (``multipart/form-data``, else a 415), which a page can send
  without asking first, and ``POST /v1/batches/{id}/cancel`` has no body at all. So in keyless
  mode, on any bind, these refuse with a 403 a request that says it comes from a page: one with
  an ``Origin`` header (OpenAI's SDKs and curl send none), or with ``Sec-Fetch-Site`` other than
  ``none`` or ``same-origin`` (a browser sends it with every request). The ``Host`` check above
  holds for them too. With keys, a page has no key to send.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.config import ServerSettings, Settings
from proxy.errors import (
    ConfigError,
    Forbidden,
    MisdirectedRequest,
    ProxyError,
    Unauthorized,
    UnsupportedMediaType,
)
from proxy.ledger.db.location import from_settings
from proxy.ledger.tenants import keys as keys_mod
from proxy.server.limits import body_pending
from proxy.server.lookup import services_in
from proxy.server.render import render
from proxy.serving.services import Services

log = structlog.get_logger("frugal.auth")

OPEN_PATHS = frozenset({"/healthz", "/dashboard"})
OPEN_PREFIXES = ("/dashboard/",)  # the dashboard's files
FORM_PATHS = frozenset({"/v1/files", "/files"})  # a POST there is multipart/form-data
_BARE_POST = re.compile(r"(/v1)?/batches/[^/]+/cancel")  # a POST there has no body


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

    The :class:`Authenticator` is the app's (:class:`~proxy.serving.services.Services`), looked
    up per request: the lifespan builds it after this middleware is made, before any request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = services_in(scope) if scope["type"] == "http" else None
        if services is None or not services.auth.enabled:
            await self.app(scope, receive, send)
            return
        key = services.auth.key_of(presented_key(scope))
        scope_state = scope.setdefault("state", {})
        scope_state["authenticated"] = key is not None
        scope_state["admin"] = key is not None and key.admin
        if key is not None:
            scope_state["key_name"] = key.name
            scope_state["client_key"] = key
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if (
            path in OPEN_PATHS
            or path.startswith(OPEN_PREFIXES)
            or (path == "/metrics" and services.settings.server.metrics_open)
        ):
            await self.app(scope, receive, send)
            return
        has_key = presented_key(scope) is not None
        error = Unauthorized(
            "Incorrect API key provided. Send a key of this proxy as "
            "'Authorization: Bearer KEY' (frugal keys create NAME makes one)."
            if has_key
            else "You didn't provide an API key. Send a key of this proxy as "
            "'Authorization: Bearer KEY'.",
            headers={"connection": "close"} if body_pending(scope) else None,
        )
        log.info(
            "rejected",
            request_id=scope_state.get("request_id"),
            method=scope.get("method"),
            path=path[:100],
            status=401,
            reason="wrong_key" if has_key else "no_key",
        )
        services.metrics.rejected("unauthorized")
        await render(error, scope_state.get("request_id"))(scope, receive, send)


class RequestGuard:
    """415 for a POST that is not ``application/json``; 421 for a foreign ``Host`` in keyless
    mode on a loopback bind (see the module docstring for why)."""

    def __init__(
        self, app: ASGIApp, settings: ServerSettings, json_paths: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.server = settings
        self.loopback = is_loopback(settings.host)  # the Host check applies on a loopback bind
        self.json_paths = frozenset(json_paths)
        """Where a POST carries a JSON body; a POST elsewhere is left to the router (405)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        services = services_in(scope)
        error, reason = self._check(scope, services)
        if error is None:
            await self.app(scope, receive, send)
            return
        scope_state = scope.get("state", {})
        log.info(
            "rejected",
            request_id=scope_state.get("request_id"),
            method=scope.get("method"),
            path=str(scope.get("path", ""))[:100],
            status=error.status,
            reason=reason,
        )
        if services is not None:
            services.metrics.rejected(reason)
        await render(error, scope_state.get("request_id"))(scope, receive, send)

    def _check(self, scope: Scope, services: Services | None) -> tuple[ProxyError | None, str]:
        host = content_type = None  # the first of each, as Starlette's request.headers reads
        for key, value in scope.get("headers", ()):
            if key == b"host" and host is None:
                host = value.decode("latin-1")
            elif key == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
        if self.loopback and (services is None or not services.auth.enabled):
            if host is not None and not host_is_local(host, self.server.host):
                return (
                    MisdirectedRequest(
                        "This proxy has no client keys, so it answers only requests addressed "
                        "to a loopback name (localhost, 127.0.0.1, [::1]). To serve other host "
                        "names (a TLS proxy in front), create a key: frugal keys create NAME."
                    ),
                    "misdirected",
                )
        path = scope.get("path")
        if scope.get("method") == "POST" and (
            path in FORM_PATHS or _BARE_POST.fullmatch(str(path))
        ):
            if (services is None or not services.auth.enabled) and from_a_page(scope):
                return (
                    Forbidden(
                        "This proxy has no client keys, so it refuses an upload or a cancel "
                        "sent by a web page (an Origin or Sec-Fetch-Site header). Send it "
                        "without one, or create a key: frugal keys create NAME."
                    ),
                    "cross_origin",
                )
            if path in FORM_PATHS and not content_type_is(content_type, "multipart/form-data"):
                return (
                    UnsupportedMediaType(
                        "Send the file with the header 'Content-Type: multipart/form-data'."
                    ),
                    "unsupported_media_type",
                )
            return None, ""
        if scope.get("method") == "POST" and path in self.json_paths and not is_json(content_type):
            return (
                UnsupportedMediaType(
                    "Send the request body as JSON with the header "
                    "'Content-Type: application/json'."
                ),
                "unsupported_media_type",
            )
        return None, ""


def is_json(content_type: str | None) -> bool:
    """``application/json``, in any case, with or without parameters (``; charset=utf-8``)."""
    return content_type_is(content_type, "application/json")


def content_type_is(content_type: str | None, kind: str) -> bool:
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == kind


def from_a_page(scope: Scope) -> bool:
    """Whether a request says it comes from a web page: an ``Origin`` header, or a
    ``Sec-Fetch-Site`` other than ``none`` (typed by the user) or ``same-origin``."""
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            return True
        if name == b"sec-fetch-site" and value.strip().lower() not in (b"none", b"same-origin"):
            return True
    return False


@functools.lru_cache(maxsize=256)
def host_is_local(host: str, bound: str) -> bool:
    """Whether a ``Host`` header names a loopback address, or ``bound`` (the configured host),
    with or without a port."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1] or [::1]:8080
        name, close, rest = host[1:].partition("]")
        if not close or (rest and not _is_port(rest)):
            return False
    else:
        name, colon, port = host.rpartition(":") if ":" in host else (host, "", "")
        if colon and not port.isdigit():
            return False
        if ":" in name:  # a bare IPv6 address is not a valid Host
            return False
    name = name.removesuffix(".")
    if not name:
        return False
    bound = bound.strip().lower().strip("[]")
    return name == bound or is_loopback(name)


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit()


# -- the bind check ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
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
    rather than a 401 for everyone later), and reads the stored ones even when the environment
    has some: stored keys that cannot be read are a :class:`ConfigError` too.
    """
    server = settings.server
    from_env = bool(keys_mod.env_keys(server.api_keys_env))
    configured = keys_mod.stored_count(from_settings(settings.ledger)) > 0 or from_env
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
