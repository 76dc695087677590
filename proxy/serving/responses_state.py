"""Stored Responses: what ``store`` keeps, what ``previous_response_id`` continues, and what
``GET``/``DELETE /v1/responses/{id}`` and its ``input_items`` read (those routes are
:mod:`proxy.server.stored_responses`).

:class:`ResponsesState` is one of the app's services. The rows live in the ledger database
(:mod:`proxy.ledger.responses_store`, SQLite or a PostgreSQL shared by replicas); every call to
it runs in a worker thread, never on the event loop.

Who sees what: a response belongs to the key that made it (its identity, not its name). A
client key reads, continues and deletes its own only; any other id, stored or not, is the same
404 ``not_found``, so a key cannot learn that another's id exists. An admin key, and anyone in
keyless mode, may read any (:func:`proxy.serving.clients.own_key`).

What a key keeps is bounded (``[responses] max_stored_bytes_per_key`` and
``max_stored_per_key``): :meth:`ResponsesState.admit` refuses a request with ``store`` from a
key at its bound with a 400 ``store_quota_exceeded`` naming ``store``, before anything is spent
on it; an answer that would still pass the bound (the request's own was not known before) is
sent with ``store: false``, as is one whose JSON cannot be written.

An ``item_reference`` input item (``{"type": "item_reference", "id": ...}``) is put in place by
:meth:`ResponsesState.resolved` before the request is checked and routed: the stored input or
output item with that id, among the responses its key may read (the rule above; another key's
item is the same 400 as one that does not exist, naming ``input[i].id``). A request names at
most :data:`MAX_REFERENCES` of them.

A database that cannot be reached: storing a new response is skipped (its answer says
``store: false``, and a warning without content is logged); reading or deleting one is a 503
``store_unavailable``. Stored content never goes to the logs.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from proxy.config import Settings
from proxy.errors import BadRequest, NotFound, StoreFull, StoreUnavailable
from proxy.ledger.db.connections import Pool, Unavailable
from proxy.ledger.db.location import Database
from proxy.ledger.responses_store import QuotaFull, ResponseStore, StoredResponse, Usage, size
from proxy.protocol.responses_translate import stand_in
from proxy.protocol.validate import responses_request
from proxy.serving.clients import Caller, own_key
from proxy.upstream.responses_api import API_ONLY

log = structlog.get_logger("frugal.responses")

T = TypeVar("T")
MAX_REFERENCES = 100
"""Most ``item_reference`` items one request may name (each one is a lookup in the store)."""
MAX_TALLIES = 10_000
"""Keys whose stored-responses tally one process keeps in memory (:class:`Tallies`)."""
SMALL_ITEMS, SMALL_ITEMS_CHARS = 2_000, 64 * 1024
"""Input items measured on the event loop at most; larger ones are measured in a thread."""
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_items(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A checked ``input`` as the items OpenAI lists for it: each with its ``id`` (the one sent,
    or a new one), messages with ``type`` and a list of content parts."""
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    items: list[dict[str, Any]] = []
    for raw in given:
        item = dict(raw)
        item_type = item.setdefault("type", "message")
        if item_type == "message":
            content = item["content"]
            if isinstance(content, str):
                part = "output_text" if item["role"] == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content}]
            item.setdefault("status", "completed")
        item.setdefault("id", f"{_ID_PREFIX.get(item_type, 'item')}_{uuid.uuid4().hex}")
        items.append(item)
    return items


def fields_checked(body: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``body``, of a side endpoint of ``/v1/responses`` that takes only ``fields``
    (``/compact``, ``/input_tokens``): any other field is a 400 naming it, then the Responses
    checks of those it has (with item references, only the references: the rest is checked
    once they are in place)."""
    for name in body:
        if name not in fields:
            raise BadRequest(
                f"Unrecognized request argument supplied: {name}",
                param=name,
                code="unknown_parameter",
            )
    at = references(body)
    if at:
        check_references(body, at)
        return body
    responses_request(stand_in(body, API_ONLY)[0])
    return body


def references(body: Any) -> list[int]:
    """Where the ``item_reference`` items of a request body's ``input`` list are."""
    given = body.get("input") if isinstance(body, dict) else None
    if not isinstance(given, list):
        return []
    return [
        i
        for i, item in enumerate(given)
        if isinstance(item, dict) and item.get("type") == "item_reference"
    ]


def check_references(body: dict[str, Any], at: list[int]) -> None:
    """The item references of ``body`` at the indexes ``at``: at most :data:`MAX_REFERENCES`,
    each with a string ``id`` and nothing else."""
    if len(at) > MAX_REFERENCES:
        raise BadRequest(
            f"'input' names {len(at)} item_reference items; at most {MAX_REFERENCES} are "
            "served in one request",
            param="input",
        )
    for i in at:
        item = body["input"][i]
        if not isinstance(item.get("id"), str) or not item["id"]:
            raise BadRequest(
                f"'input[{i}].id' must be the id of a stored item", param=f"input[{i}].id"
            )
        extra = sorted(set(item) - {"type", "id"})
        if extra:
            raise BadRequest(
                f"'input[{i}].{extra[0]}': an item_reference has only 'type' and 'id'",
                param=f"input[{i}].{extra[0]}",
            )


def _small(items: list[dict[str, Any]]) -> bool:
    """Whether ``items`` are few and short enough to be measured on the event loop (at most
    :data:`SMALL_ITEMS` values, strings of :data:`SMALL_ITEMS_CHARS` characters in all): a
    walk that stops as soon as they are not."""
    values, chars = 0, 0
    stack: list[Any] = list(items)
    while stack:
        value = stack.pop()
        values += 1
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            chars += len(value)
        if values > SMALL_ITEMS or chars > SMALL_ITEMS_CHARS:
            return False
    return True


class Tallies:
    """What each key keeps, as this process last read it from the store (at a write, a delete,
    a refusal, or the key's first stored request), so that :meth:`ResponsesState.admit` needs
    no round trip for a key under its quota.

    Never trusted towards storing past the quota: :meth:`ResponseStore.put` checks the tally
    again, in the transaction that writes, and what it read comes back here. Replicas on one
    PostgreSQL share the quota; what another replica stores makes this copy too low (the
    request is then refused at ``put``, after its answer, and sent with ``store: false``), and
    what another deletes or prunes makes it too high, which ``admit`` never refuses on
    without reading the tally again. A prune here forgets every copy (``prunes``, the
    store's count of them, tells). At most :data:`MAX_TALLIES` keys, the oldest read
    forgotten first."""

    def __init__(self) -> None:
        self._usage: dict[str | None, Usage] = {}
        self._prunes = 0

    def get(self, owner: str | None, prunes: int) -> Usage | None:
        if prunes != self._prunes:
            self._usage.clear()
            self._prunes = prunes
        return self._usage.get(owner)

    def set(self, owner: str | None, usage: Usage, prunes: int) -> None:
        """Remember ``usage``; ``prunes``: the store's count of them now (one that ran while
        it was read can only have made it too high)."""
        if self.get(owner, prunes) is None and len(self._usage) >= MAX_TALLIES:
            del self._usage[next(iter(self._usage))]
        self._usage.pop(owner, None)
        self._usage[owner] = usage


def _not_found(response_id: str, param: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


class ResponsesState:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.pool = Pool(db, size=2, timeout_s=3.0)
        bounds = settings.responses
        self.store = ResponseStore(
            self.pool,
            retention_days=bounds.retention_days,
            max_bytes=bounds.max_stored_bytes_per_key,
            max_count=bounds.max_stored_per_key,
        )
        self.tallies = Tallies()

    async def start(self) -> None:
        try:
            gone = await asyncio.to_thread(self.store.prune)
        except Unavailable as exc:
            log.warning("responses_prune_failed", reason=str(exc))
        else:
            if gone:
                log.info("responses_pruned", deleted=gone)

    async def stop(self) -> None:
        await asyncio.to_thread(self.pool.close)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except Unavailable as exc:
            raise StoreUnavailable(
                "The stored responses cannot be read now: the ledger database is unavailable."
            ) from exc

    # -- the request's side -----------------------------------------------------------------

    async def history(self, request: Caller, previous_id: str) -> list[dict[str, Any]]:
        """The conversation ``previous_id`` ended: each turn's input items, then its output
        items, oldest first. Not stored, or another key's: a 404 naming
        ``previous_response_id``."""
        chain = await self._call(self.store.chain, previous_id)
        if not chain or not _visible(request, chain[-1]):
            raise _not_found(previous_id, "previous_response_id")
        items: list[dict[str, Any]] = []
        for turn in chain:
            items.extend(turn.input_items)
            items.extend(turn.response.get("output") or [])
        return items

    async def resolved(self, request: Caller, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with each ``item_reference`` of its ``input`` (checked by
        :func:`check_references`) replaced by the stored item it names. Not stored, or not
        the request's key's to read: a 400 naming ``input[i].id``."""
        key = own_key(request.scope)
        owner = key.identity if key is not None else None
        given = list(body["input"])
        for i in references(body):
            item_id = given[i]["id"]
            found = await self._call(self._item, item_id, owner)
            if found is None:
                raise BadRequest(
                    f"Item with id '{item_id}' not found.", param=f"input[{i}].id", code="not_found"
                )
            given[i] = found
        return {**body, "input": given}

    def _item(self, item_id: str, owner: str | None) -> dict[str, Any] | None:
        return self.store.item(item_id, owner, anyone=owner is None)  # None: sees everything

    async def admit(self, request: Caller, items: list[dict[str, Any]]) -> None:
        """Refuse (a 400 :class:`StoreFull` naming ``store``) a request that asks to store a
        response, with the input ``items``, for a key that cannot keep one more. A database
        that cannot be reached refuses nothing here: the response is then not stored.

        Checked against the key's tally as this state last saw it (:class:`Tallies`): a key
        that fits it costs no round trip. One that does not, or whose tally is not known yet,
        is read from the database first, since another replica may have deleted meanwhile."""
        key = getattr(request.state, "client_key", None)
        owner = key.identity if key is not None else None
        adding = size(items) if _small(items) else await asyncio.to_thread(size, items)
        known = self.tallies.get(owner, self.store.prunes)
        if known is not None and self.store.fits(known, adding):
            return  # put checks it again, exactly, in the transaction that writes
        try:
            usage = await asyncio.to_thread(self.store.usage, owner)
        except Unavailable as exc:
            log.warning("responses_quota_unread", reason=str(exc))
            return
        self.tallies.set(owner, usage, self.store.prunes)
        if not self.store.fits(usage, adding):
            raise StoreFull(
                f"This key keeps {usage.count} stored responses of {usage.bytes} bytes, and "
                f"one more with {adding} bytes of input would pass its quota of "
                f"{self.store.max_count} responses or {self.store.max_bytes} bytes ([responses] "
                "max_stored_per_key, max_stored_bytes_per_key). Delete stored responses "
                "(DELETE /v1/responses/{id}), or send 'store': false.",
                param="store",
            )

    async def keep(
        self,
        request: Caller,
        response: dict[str, Any],
        items: list[dict[str, Any]],
        route: str,
        *,
        lease_s: float | None = None,
        holder: str | None = None,
    ) -> bool:
        """Store ``response`` and its input ``items`` for the request's key; whether it was.
        ``lease_s``: a background response, held by ``holder`` (this process) that long from
        now."""
        key = getattr(request.state, "client_key", None)
        now = time.time()
        stored = StoredResponse(
            id=response["id"],
            owner=key.identity if key is not None else None,
            key_name=getattr(request.state, "key_name", None),
            created_at=now,
            previous_id=response.get("previous_response_id"),
            route=route,
            response={**response, "store": True},
            input_items=items,
            lease_until=None if lease_s is None else now + lease_s,
            lease_owner=holder,
        )
        try:
            kept = await asyncio.to_thread(self.store.put, stored)
        except Unavailable as exc:
            log.warning("response_not_stored", reason=str(exc))
            return False
        except QuotaFull as exc:
            self.tallies.set(stored.owner, exc.usage, self.store.prunes)
            log.warning(
                "response_not_stored", reason="quota", kept=exc.usage.bytes, adding=exc.adding
            )
            return False
        except ValueError as exc:  # JSON that UTF-8 cannot write (UnicodeEncodeError)
            log.warning("response_not_stored", reason=exc.__class__.__name__)
            return False
        self.tallies.set(stored.owner, kept.usage, self.store.prunes)
        return True

    async def advance(
        self,
        response_id: str,
        response: dict[str, Any],
        route: str,
        *,
        only_from: tuple[str, ...],
        lapsed_at: float | None = None,
    ) -> bool:
        """A background response's next state, only while its status is one of ``only_from``
        (and its lease has passed at ``lapsed_at``, if given: :meth:`ResponseStore.advance`);
        whether it was written."""
        advance = functools.partial(
            self.store.advance, route=route, only_from=only_from, lapsed_at=lapsed_at
        )
        return await self._call(advance, response_id, response)

    async def renew(self, response_ids: list[str], until: float | None) -> int:
        """Set the lease of background responses (:meth:`ResponseStore.renew`)."""
        return await self._call(self.store.renew, response_ids, until)

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response ``response_id``, whoever made it (the service's own read)."""
        return await self._call(self.store.get, response_id)

    async def unfinished(self, *, leased: bool) -> list[StoredResponse]:
        """The background responses ``queued`` or ``in_progress``, with their leases
        (:meth:`ResponseStore.unfinished`)."""
        return await self._call(functools.partial(self.store.unfinished, leased=leased))

    async def remove(self, response_id: str) -> None:
        freed = await self._call(self.store.delete, response_id)
        if freed is None:
            raise _not_found(response_id, "response_id")  # deleted meanwhile
        self.tallies.set(freed.owner, freed.usage, self.store.prunes)

    async def visible(self, request: Caller, response_id: str) -> StoredResponse:
        found = await self._call(self.store.get, response_id)
        if found is None or not _visible(request, found):
            raise _not_found(response_id, "response_id")
        return found


def _visible(request: Caller, stored: StoredResponse) -> bool:
    key = own_key(request.scope)
    return key is None or stored.owner == key.identity
