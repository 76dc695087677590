"""What a client key may do, on the request path: its models, its requests per minute, its
monthly budget, and the response cache it may be answered from.

:class:`Quotas` is one of the app's services. :mod:`proxy.server.shares` calls ``admit_rate``
from the headers, before the body is read: a key past its ``rpm`` is a 429 with
``Retry-After`` (:mod:`proxy.ledger.tenants.rpm`), so a key at its limit cannot hold a slot while it
sends a body. The handlers call it at four points (:mod:`proxy.serving.cascade`,
:mod:`proxy.serving.chat`):

- ``admit`` once the model is known: a model the key may not use is a 403 naming ``model``.
- ``cached`` before the local attempt, ``remember`` after an answer
  (:mod:`proxy.ledger.response_cache`);
  a key's entries are its own, by its identity (:attr:`ClientKey.identity`), not its name, which
  a revoked key hands on.
- ``reserve`` before every upstream call, the audit's too (:class:`AuditPurse`): the
  worst-case cost of the exact body that call posts (:meth:`Upstream.sent`), never of a
  local count: its whole serialized body as prompt tokens, plus ``max_tokens``, or else the
  model's own output limit, for each of ``n`` or ``best_of`` choices and, on
  ``/completions``, each prompt of a list, at the API model's price, plus a stated bound for
  images, files and built-in tools (:func:`worst_case_tokens`, :func:`unmeasured_tokens`),
  is reserved in the database (:mod:`proxy.ledger.tenants.budgets`).
  :class:`BudgetExhausted` (429, ``insufficient_quota``) when it would pass the budget;
  :class:`BudgetUnavailable` (503) when the database cannot be reached: budgets fail closed.
- ``settle`` when the row is written: the real cost replaces the reservation, in the
  background. Until then the reservation is held, however long the call runs: its expiry is a
  lease of ``[ledger] reservation_lease_s`` that a task here renews every third of it, for all
  of this process's reservations in one statement (:meth:`Budgets.renew`); a settle that never
  happens (a crash) is released by the sweep once the lease runs out.

The database's state is in ``/healthz`` (``health``), ``degraded`` with the reason while its
last call failed. All database calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import structlog

from proxy.config import Settings
from proxy.engine.generate import ModelLoadError, bundled_model_path
from proxy.errors import BudgetExhausted, BudgetUnavailable, ModelNotAllowed, TooManyRequests
from proxy.ledger.db.connections import Pool, Unavailable
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PriceBook, requested_billing
from proxy.ledger.response_cache import ResponseCache, cache_key, cacheable
from proxy.ledger.tenants.budgets import Budgets, Reservation
from proxy.ledger.tenants.keys import ClientKey
from proxy.ledger.tenants.rpm import LocalWindow, RateLimits
from proxy.serving.background import stop_task
from proxy.upstream.client import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH, Upstream
from quality.combiner import file_sha256

log = structlog.get_logger("frugal.quotas")

T = TypeVar("T")
SWEEP_S = 5.0
DEFAULT_MAX_OUTPUT = 4096
"""Completion tokens reserved when a request names no ``max_tokens`` and the price map does not
say how long the API model's answers can be (:meth:`PriceBook.max_output_tokens`)."""


IMAGE_TOKENS = 48_169
"""What one image part (``input_image``, chat's ``image_url``) is reserved, whatever its bytes:
the most OpenAI's published image pricing bills for one image, gpt-4o-mini's 2,833 + 8 tiles of
5,667 tokens (an image of 2048 × 768 at ``detail: high``); other models bill fewer tokens."""
DEFAULT_WINDOW = 128_000
"""The input window assumed when the price map does not say a model's (``max_input_tokens``)."""
_IMAGE_PARTS = frozenset({"input_image", "image_url"})
_WINDOW_PARTS = frozenset({"input_file", "file", "input_audio"})  # as long as the window allows
_CALLED_BY_CLIENT = frozenset({"function", "custom"})  # every other tool runs on the API's side


def _parts(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The content parts of a chat or Responses body: messages' ``content``, and a tool
    output's (a ``function_call_output`` may hold images and files)."""
    for field in ("messages", "input"):
        items = body.get(field)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            for name in ("content", "output"):
                parts = item.get(name)
                if isinstance(parts, list):
                    yield from (p for p in parts if isinstance(p, dict))


def unmeasured_tokens(body: dict[str, Any], window: int | None) -> int:
    """Prompt tokens that no count of the body's bytes can bound, each charged a stated
    conservative bound: :data:`IMAGE_TOKENS` per image part; the API model's whole input
    ``window`` (:data:`DEFAULT_WINDOW` when unknown) per file or audio part, and per call of a
    built-in tool (``web_search``, ``file_search``, ``mcp``...: what it brings in is read by
    the model), ``max_tool_calls`` calls when the request sets it, else one per such tool."""
    window = window or DEFAULT_WINDOW
    total = 0
    for part in _parts(body):
        kind = part.get("type")
        if kind in _IMAGE_PARTS:
            total += IMAGE_TOKENS
        elif kind in _WINDOW_PARTS:
            total += window
    tools = body.get("tools")
    built_in = [
        t
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict) and t.get("type") not in _CALLED_BY_CLIENT
    ]
    if built_in:
        calls = body.get("max_tool_calls")
        total += (calls if isinstance(calls, int) and calls > 0 else len(built_in)) * window
    return total


def prompts_of(prompt: Any) -> int:
    """How many prompts a ``/v1/completions`` ``prompt`` holds, each answered ``n`` times: a
    string or one list of token ids is one; a list of strings or of token lists, its length."""
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return 1


def worst_case_tokens(
    sent: dict[str, Any],
    max_output: int | None = None,
    window: int | None = None,
    *,
    path: str = CHAT_PATH,
) -> tuple[int, int]:
    """(prompt, completion) tokens that the upstream call posting ``sent`` to ``path`` can
    cost at most, as far as can be told before it is made. ``sent`` is the exact body the call
    posts (:meth:`proxy.upstream.client.Upstream.sent`: after the model mapping, the allow-list
    and the Responses translation), never a local count of it: no local attempt's figures, nor
    a backend's report of what it read, can lower the estimate.

    The prompt side is the whole serialized body, not a list of fields, so a field a provider
    bills (``functions``, ``response_format``, ``tools``, ``instructions``, a message's
    ``name``, a ``refusal`` part, every prompt of a list, one a new endpoint adds) cannot be
    left out: its UTF-8 bytes / 2 (providers bill about 4 bytes a token). What bytes do not
    measure (images, files, built-in tools) adds :func:`unmeasured_tokens`, with the API
    model's input ``window``. The output side is ``max_tokens`` (``max_completion_tokens``,
    ``max_output_tokens``) for each of ``n`` or ``best_of`` choices, whichever is more, and on
    ``/completions`` for each prompt of a list (:func:`prompts_of`: the API answers each).
    Without it, it is ``max_output``, the API model's own limit (an answer cannot run past
    it), or 4,096 when that is not known: a model that can write 16,384 tokens would otherwise
    cost four times what was reserved for it. ``/embeddings`` answers no tokens."""
    raw = json.dumps(sent, ensure_ascii=False, separators=(",", ":"), default=str)
    prompt = len(raw.encode("utf-8")) // 2 + 16 + unmeasured_tokens(sent, window)
    if path == EMBEDDINGS_PATH:
        return prompt, 0
    cap = (
        sent.get("max_completion_tokens")
        or sent.get("max_tokens")
        or sent.get("max_output_tokens")
        or max_output
        or DEFAULT_MAX_OUTPUT
    )
    choices = max(int(sent.get("n") or 1), int(sent.get("best_of") or 1))  # validated ints
    if path == COMPLETIONS_PATH:
        choices *= prompts_of(sent.get("prompt"))
    return prompt, int(cap) * choices


class Quotas:
    def __init__(self, settings: Settings, db: Database, prices: PriceBook) -> None:
        self.settings = settings
        self.db = db
        self.prices = prices
        self.pool = Pool(db, size=4, timeout_s=3.0)
        self.budgets = Budgets(self.pool)
        self.limits = RateLimits(self.pool)
        self.window = LocalWindow()
        cache = settings.cache
        self.cache = ResponseCache(self.pool, ttl_s=cache.ttl_s, max_entries=cache.max_entries)
        # An unrenewed reservation's life: the lease, renewed while its call runs.
        self.reservation_ttl_s = settings.ledger.reservation_lease_s
        self.model_hash: str | None = None
        self._failing_since: float | None = None
        self._reason: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.cache.enabled:  # a model file is gigabytes: read it only when needed
            self.model_hash = await asyncio.to_thread(_model_hash, self.settings.local.model_path)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="quotas-sweep")
        self._renewer = asyncio.create_task(self._renew_forever(), name="quotas-renew")

    async def stop(self) -> None:
        await stop_task(self._renewer)
        await stop_task(self._sweeper)
        if self._tasks:  # settles under way: the budget must hear of them
            await asyncio.wait(set(self._tasks), timeout=0.5)
        await asyncio.to_thread(self.pool.close)

    async def written(self) -> None:
        """Wait until the writes started so far in the background (cache entries, settles)
        have ended: what a caller that must see them next awaits, rather than a guessed time."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def health(self) -> dict[str, Any]:
        return {
            "state": "degraded" if self._failing_since is not None else "ok",
            "reason": self._reason,
            "failing_since": self._failing_since,
        }

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except Unavailable as exc:
            if self._failing_since is None:
                self._failing_since = time.time()
                log.error("quotas_database_lost", reason=str(exc))
            self._reason = f"the budget and limits database cannot be reached ({exc})"
            raise
        if self._failing_since is not None:
            log.info("quotas_database_back")
        self._failing_since, self._reason = None, None
        return result

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            with contextlib.suppress(Unavailable):
                await self._call(self.budgets.sweep)
                await self._call(self.limits.sweep)
                if self.settings.cache.enabled:
                    await self._call(self.cache.sweep)

    async def _renew_forever(self) -> None:
        """Every third of the lease, the lease of each reservation still held starts again."""
        lease = self.reservation_ttl_s
        while True:
            await asyncio.sleep(lease / 3)
            with contextlib.suppress(Unavailable):  # tried again next time; the lease has room
                _, lost = await self._call(self.budgets.renew, lease)
                if lost:
                    log.warning(
                        "budget_reservations_lost",
                        count=lost,
                        detail="released by the sweep while their calls still ran (the "
                        "database was out of reach for a whole [ledger] reservation_lease_s); "
                        "their cost still counts when they settle",
                    )

    # -- admission --------------------------------------------------------------------------

    async def admit(self, key: ClientKey | None, model: str) -> None:
        """The key's models (once the body has named one)."""
        if key is None:
            return
        if key.models is not None and model not in key.models:
            raise ModelNotAllowed(
                f"the key {key.name!r} may not use the model {model!r}; it may use: "
                + ", ".join(key.models),
                param="model",
            )

    async def admit_rate(
        self, key: ClientKey | None, headers: dict[str, str] | None = None
    ) -> None:
        """The key's ``rpm``: counts this request, or raises a 429 with ``Retry-After`` (and
        ``headers``). Needs nothing of the body."""
        if key is None or key.rpm is None:
            return
        try:
            wait = await self._call(self.limits.admit, key.name, key.rpm)
        except Unavailable:
            wait = self.window.admit(key.name, key.rpm)  # this replica alone, meanwhile
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            raise TooManyRequests(
                f"the key {key.name!r} is limited to {key.rpm} requests per minute; "
                f"retry in {seconds} s",
                headers={**(headers or {}), "retry-after": str(seconds)},
            )

    # -- budgets ----------------------------------------------------------------------------

    async def reserve(
        self, key: ClientKey | None, sent: dict[str, Any], api_model: str, path: str = CHAT_PATH
    ) -> Reservation | None:
        """Reserve the worst case of the upstream call that posts ``sent`` (exactly) to
        ``path``; None when the key has no budget."""
        if key is None or key.monthly_budget_pusd is None:
            return None
        limit = self.prices.max_output_tokens(api_model)
        window = self.prices.max_input_tokens(api_model)
        prompt, completion = worst_case_tokens(sent, limit, window, path=path)
        amount = self.prices.cost(
            api_model, prompt, completion, billed=requested_billing(sent, completion, window)
        )
        if amount is None:
            raise BudgetExhausted(
                f"the key {key.name!r} has a budget, and the model {api_model!r} has no known "
                "price, so its cost cannot be held to the budget; set [pricing] for it",
                param="model",
            )
        try:
            found = await self._call(
                self.budgets.reserve,
                key.name,
                key.monthly_budget_pusd,
                amount,
                ttl_s=self.reservation_ttl_s,
            )
        except Unavailable:
            raise BudgetUnavailable(
                "the API fallback is refused: the budget database cannot be reached, so the "
                "spend of this key cannot be held to its budget (local answers are still served)"
            ) from None
        if found is None:
            raise BudgetExhausted(
                f"the monthly budget of the key {key.name!r} is spent: this request could cost "
                f"up to ${amount / 1e12:.6f} at {api_model!r}, more than is left this month "
                "(the local model still answers what it can)"
            )
        return found

    def settle(self, reservation: Reservation | None, cost_pusd: int | None) -> None:
        """In the background: the real cost (0 when unknown or unpaid) replaces the reservation."""
        if reservation is None:
            return
        self._spawn(self._call(self.budgets.settle, reservation, cost_pusd or 0))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("quotas_write_failed", error=type(t.exception()).__name__)

        task.add_done_callback(done)

    # -- the response cache -----------------------------------------------------------------

    @property
    def caching(self) -> bool:
        """Whether ``[cache]`` is on (the handlers skip the cache's steps when it is not)."""
        return self.settings.cache.enabled

    def cache_key(
        self, body: dict[str, Any], owner: str | None, route_model: str, cache_control: str
    ) -> tuple[str | None, bool]:
        """(the entry's key or None, whether a hit may be served): None when the cache is off,
        the request not deterministic, or ``Cache-Control: no-store``; no hit for ``no-cache``.
        ``owner``: the client key's identity (None without keys); unused when ``[cache]
        shared``."""
        directives = {part.strip().lower() for part in cache_control.split(",")}
        if not self.settings.cache.enabled or not cacheable(body) or "no-store" in directives:
            return None, False
        if self.model_hash is None:
            return None, False
        scope = "*" if self.settings.cache.shared else (owner or "")
        key = cache_key(body, route_model=route_model, model_hash=self.model_hash, scope=scope)
        return key, "no-cache" not in directives

    async def cached(self, key: str | None) -> dict[str, Any] | None:
        if key is None:
            return None
        try:
            return await self._call(self.cache.get, key)
        except Unavailable:
            return None

    def remember(self, key: str | None, answer: dict[str, Any]) -> None:
        if key is not None:
            self._spawn(self._call(self.cache.put, key, answer))


class AuditPurse:
    """The client key's budget that its audits' calls are paid from
    (:class:`proxy.audit.runner.Purse`): each call (a chat completion, shadow or judge) has the
    worst case of the body it posts reserved like a request's API call, and is settled with its
    real cost."""

    def __init__(
        self,
        quotas: Quotas,
        key_of: Callable[[str], ClientKey | None],
        upstream: Upstream,
    ) -> None:
        self.quotas = quotas
        self.key_of = key_of  # the stored key by its name (Authenticator.stored_key)
        self.upstream = upstream  # what a call posts (Upstream.sent), and to which model

    async def hold(self, key_name: str, body: dict[str, Any]) -> Reservation | None:
        key = self.key_of(key_name)
        sent = self.upstream.sent(CHAT_PATH, body)  # what Upstream.chat posts for it
        return await self.quotas.reserve(
            key, sent, self.upstream.target(str(body.get("model") or ""))
        )

    def pay(self, held: Reservation | None, cost_pusd: int) -> None:
        self.quotas.settle(held, cost_pusd)


def _model_hash(path: str) -> str:
    """SHA-256 of the model file the engine loads (``path``, or the bundled one); its name
    when it cannot be read."""
    try:
        return file_sha256(path or bundled_model_path())
    except (OSError, ModelLoadError):
        return "no-model-file:" + path
