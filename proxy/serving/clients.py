"""Who a caller is and what it may read: the client keys a running server accepts, and the
rights that the server's auth middleware (:mod:`proxy.server.auth`) wrote into a request's
state.

:class:`Authenticator` holds the keys of the environment and those stored in the ledger
(:mod:`proxy.ledger.tenants.keys`), re-read every :data:`REFRESH_S` seconds (1 s), so ``frugal
keys create`` and ``revoke`` take effect on a running server, and on every replica sharing a
PostgreSQL ledger, within that time plus one read. It fails closed: stored keys that cannot be
read count as "keys configured, none known" until a read succeeds, and a read that fails later
keeps the last keys read. It compares a presented key with every known digest through
``hmac.compare_digest``, so the time taken does not say how much of a guess was right.

:func:`sees_everything` and :func:`own_key` read a request's rights from its state (``admin``,
``client_key``: a mapping the middleware filled, the ASGI scope's ``state``), and
:class:`Caller` is what a service is handed to read them from: anything with a ``scope`` and a
``state``, as Starlette's request has, so that a service never imports the server.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import MutableMapping
from typing import Any, Protocol

import structlog

from proxy.config import Settings
from proxy.errors import Forbidden
from proxy.ledger.db.location import from_settings
from proxy.ledger.tenants import keys as keys_mod
from proxy.serving.background import stop_task

log = structlog.get_logger("frugal.auth")

REFRESH_S = 1.0
_NO_MATCH = bytes(32)

Scope = MutableMapping[str, Any]


class Caller(Protocol):
    """The request a service reads its caller's rights and key from (the auth middleware set
    them): its ASGI ``scope`` and its ``state`` (``client_key``, ``key_name``)."""

    @property
    def scope(self) -> Scope: ...

    @property
    def state(self) -> Any: ...


class Authenticator:
    """The keys a running server accepts: the environment's, plus the database's, refreshed."""

    def __init__(self, settings: Settings) -> None:
        self._env = keys_mod.env_keys(settings.server.api_keys_env)
        self._db_path = from_settings(settings.ledger)
        self._stored: list[keys_mod.ClientKey] = []
        self._by_name: dict[str, keys_mod.ClientKey] = {}
        self._ever_stored = 0
        self._read_once = False  # a read of the stored keys has succeeded
        self._unreadable = False  # no read has succeeded yet, and one has failed
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        """Whether requests need a key: keys are configured, or might be (see the module)."""
        return bool(self._env) or self._ever_stored > 0 or self._unreadable

    async def start(self) -> None:
        """Read the stored keys (the ledger has created the table), then keep them fresh."""
        await self.refresh()
        self._task = asyncio.create_task(self._refresher(), name="keys-refresh")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def refresh(self) -> None:
        """Re-read the stored keys. A failed read keeps the last good set; a failed first read
        locks the proxy (only the environment's keys match) until a read succeeds."""
        try:
            stored, ever = await asyncio.to_thread(keys_mod.load_active, self._db_path)
        except Exception as exc:  # noqa: BLE001 - fail closed, whatever the error
            if not self._read_once:
                if not self._unreadable:
                    log.error(
                        "keys_unreadable",
                        error=type(exc).__name__,
                        detail="the stored client keys cannot be read; every request needs a "
                        "key, and only keys from the environment are accepted until they can",
                    )
                self._unreadable = True
            else:
                log.warning("keys_refresh_failed", error=type(exc).__name__)
            return
        if self._unreadable:
            log.info("keys_readable", stored=ever)
        self._stored, self._ever_stored = stored, max(ever, self._ever_stored)
        self._by_name = {key.name: key for key in stored}
        self._read_once, self._unreadable = True, False

    async def _refresher(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.refresh()

    def stored_key(self, name: str | None) -> keys_mod.ClientKey | None:
        """The stored key of that name, with its limits (None: a key of the environment's,
        which has none, or no key)."""
        return self._by_name.get(name) if name else None

    def name_by_identity(self, identity: str | None) -> str | None:
        """The name of the key whose identity is ``identity`` (what a batch's owner is kept
        as), or None: no key, or one revoked since."""
        if identity is None:
            return None
        for key in (*self._env, *self._stored):
            if key.identity == identity:
                return key.name
        return None

    def name_of(self, presented: str | None) -> str | None:
        """The name of the key ``presented``, or None. Every known digest is compared."""
        key = self.key_of(presented)
        return None if key is None else key.name

    def key_of(self, presented: str | None) -> keys_mod.ClientKey | None:
        """The key ``presented`` (its name, limits and identity), or None. Every known digest
        is compared."""
        candidate = keys_mod.digest(presented) if presented else _NO_MATCH
        found: keys_mod.ClientKey | None = None
        for key in (*self._env, *self._stored):
            if hmac.compare_digest(candidate, key.digest) and presented:
                found = key
        return found


def sees_everything(scope: Scope) -> bool:
    """Whether a request may read every key's figures and the server's details: an admin key,
    or keyless mode (no key is configured, so there is no one else to hide them from)."""
    return bool(scope.get("state", {}).get("admin", True))


def own_key(scope: Scope) -> keys_mod.ClientKey | None:
    """The client key whose own figures alone a request may read; None when it may read
    everything (:func:`sees_everything`). A keyed request that reaches a data path without a key
    cannot happen (the middleware answers 401 first); it gets :class:`Forbidden` all the same."""
    if sees_everything(scope):
        return None
    key: keys_mod.ClientKey | None = scope.get("state", {}).get("client_key")
    if key is None:
        raise Forbidden("This needs a key of this proxy: send it as 'Authorization: Bearer KEY'.")
    return key
