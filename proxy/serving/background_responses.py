"""Background responses: ``background: true`` on ``POST /v1/responses``, run after the request
has its answer, polled with ``GET /v1/responses/{id}`` and cancelled with ``POST
/v1/responses/{id}/cancel``, as OpenAI's background mode is.

:meth:`BackgroundResponses.submit` stores the request's ``queued`` response (background needs
``store``: it is how the client reads the answer) and starts its run, a task of this service;
the caller (``proxy.server.responses``) is sent the queued response at once. The run marks it
``in_progress``, then runs the request through the Responses cascade as deferred work: the local
model first, with ``[batch] flex_timeout_s`` as its deadline instead of the interactive one,
gated, then the API. The finished response takes the queued one's place in the store
(:meth:`finish`: ``completed``, ``incomplete`` or ``failed``), under the same id. Its ledger
row is the run's own, written once by the cascade, with ``deferred_tier`` ``background`` (or
``flex`` when the request asked ``service_tier: "flex"``): OpenAI bills a background response at
the tier it asked for, the standard rate by default, so only ``flex`` is priced lower. The
request that queued it writes no row of its own.

Every move is one conditional write (:meth:`ResponsesState.advance`): ``queued`` →
``in_progress`` → its end, or ``cancelled`` from either of the first two. So a cancel and the
run's own end cannot both win: the one that writes second finds the status moved and changes
nothing.

**Streams.** ``stream: true`` with ``background: true``, and ``GET /v1/responses/{id}?stream=
true&starting_after=N``, send the response's typed events once it has ended (:meth:`ended`,
which reads the store until then), from sequence number N+1. The events are made again from the
stored response, always the same for the same response, so a client that lost its stream
resumes it where it left off; they come when the response has ended, not token by token.

**Bound.** A key has at most ``[responses] max_background_per_key`` background responses
queued or running in this process: one more is a 429 naming ``background``, before anything is
stored or spent (each is a task holding its request until it ends).

**Cancel** (:meth:`cancel`): a queued or running response is marked ``cancelled``, and its run,
when this process holds it, is cancelled: the local generation stops, an API call is abandoned,
and the cascade writes its row (``client_gone``). A finished response is answered as it is,
as OpenAI answers a second cancel. One that is not a background response is a 400 naming
``response_id``; another key's, a 404.

**Stop and start.** When the app stops, the runs it holds are cancelled (each writes its row)
and their responses marked ``failed``; those cancelled before their run began stay ``queued``.
A response cancelled while queued has a row of its own (499, nothing spent).
At start (:meth:`start`) every background response left ``queued`` or ``in_progress`` (by a
proxy killed with ``kill -9``, or one stopped before the run began) whose lease has passed is
marked ``failed`` (``server_error``, "the proxy stopped before ...") with one ledger row of its
own, since its run wrote none. They are not run again: the client that polls learns that it
failed, and may send it again, rather than being billed twice for an answer a killed run may
have paid for already.

**Leases, for replicas.** A background response is held by the process that runs it, as a batch
line is by its worker: it is stored with a lease of ``lease_s`` (``[batch] line_lease_s``) in
this process's name (``host:pid``, :mod:`proxy.serving.holders`), which this process renews
every third of it while the response is queued or running here (a stop gives up the lease of
those never begun).
A lease has lapsed (:func:`lapsed`) once its time has passed, or at once when its holder was a
process of this host that is gone (a restart after ``kill -9``). A replica starting beside
another on one PostgreSQL fails only the responses whose lease has lapsed, never those another
replica runs; and each process sweeps, at every renewal, the open responses whose lease has
lapsed since (their process was killed), and fails them the same way, so that a replica killed
with ``kill -9`` leaves no response open for longer than about ``lease_s`` and a third while
another one runs (a third, on its own host). The move to ``failed`` is made only while the lease
still ends by the time judged (:meth:`ResponsesState.advance`'s ``lapsed_at``), so a renewal
that commits first wins, and a response is failed, with its row, once. Replicas' clocks are
compared through the leases, and their hosts told apart by name: keep the clocks in step (NTP),
well within ``lease_s``, and give each replica's host (or container) a name of its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Container
from typing import TYPE_CHECKING, Any

import structlog

from proxy.errors import BadRequest, ProxyError, StoreUnavailable, TooManyRequests
from proxy.serving.clients import Caller
from proxy.serving.exchange import Exchange
from proxy.serving.holders import gone, holder

if TYPE_CHECKING:
    from proxy.ledger.responses_store import StoredResponse
    from proxy.serving.responses_state import ResponsesState

log = structlog.get_logger("frugal.background")

QUEUED, IN_PROGRESS, CANCELLED, FAILED = "queued", "in_progress", "cancelled", "failed"
OPEN = (QUEUED, IN_PROGRESS)
"""The statuses of a background response not finished yet."""
TIER = "background"
"""The ledger's ``deferred_tier`` of a background response (``flex`` when it asked for flex)."""
ROUTE = "background"
"""The stored row's ``route`` until the run says which route answered."""

POLL_S = 0.1
"""How often a stream of a background response reads the store until the response has ended."""

Run = Callable[[str], Awaitable[None]]
"""Runs the background response with this id to its end (its :meth:`finish` included)."""


def queued(response: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object made for the request, as a queued background response."""
    return {
        **response,
        "status": QUEUED,
        "background": True,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }


def lapsed(stored: StoredResponse, now: float, me: str, mine: Container[str]) -> float | None:
    """When the lease of the open background response ``stored`` has lapsed, the time its
    lease must still end by for a sweep to fail it (``lapsed_at``); None while its holder may
    be alive. ``me``: this process's :func:`holder`; ``mine``: the responses it runs."""
    if stored.id in mine:
        return None
    until = stored.lease_until
    if until is None or until <= now:
        return now
    if stored.lease_owner == me:  # this name, not run here: a process before this one, gone
        return until
    if gone(stored.lease_owner):  # a process of this host, gone: no need to wait for its lease
        return until
    return None


def _failed(response: dict[str, Any], message: str, code: str = "server_error") -> dict[str, Any]:
    return {**response, "status": FAILED, "error": {"code": code, "message": message}}


class BackgroundResponses:
    """The background responses of one app: their runs, their moves in the store."""

    def __init__(self, state: ResponsesState, *, max_per_key: int, lease_s: float) -> None:
        self.state = state
        self.max_per_key = max_per_key
        self.lease_s = lease_s
        self.holder = holder()
        self._storing: set[str] = set()  # ids being stored, not run yet
        self._keeper: asyncio.Task[None] | None = None  # renews leases, sweeps lapsed ones
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._begun: set[str] = set()  # runs that reached the cascade (and so write a row)
        self._held: dict[str | None, int] = {}  # per key identity: queued or running here
        self._write_row: Callable[[Exchange], None] | None = None  # rows of runs never begun
        self._stopping = False
        self._cancelled: set[str] = set()  # cancelled by a client, not by the stop

    @property
    def running(self) -> int:
        """Background responses queued or running in this process."""
        return len(self._runs)

    async def submit(
        self, request: Caller, response: dict[str, Any], items: list[dict[str, Any]], run: Run
    ) -> dict[str, Any]:
        """Store ``response`` (the request's, with ``input`` ``items``) as queued, start its
        ``run``, and return the queued response. Not stored: a 503, and nothing runs."""
        key = getattr(request.state, "client_key", None)
        owner = key.identity if key is not None else None
        if self._held.get(owner, 0) >= self.max_per_key:
            raise TooManyRequests(
                f"This key has {self.max_per_key} background responses queued or running "
                "([responses] max_background_per_key): wait for one to end, or cancel one.",
                param="background",
            )
        self._held[owner] = self._held.get(owner, 0) + 1  # held before the first await
        shell = queued(response)
        self._storing.add(shell["id"])  # a sweep meanwhile must not take it for a dead one's
        try:
            kept = await self.state.keep(
                request, shell, items, ROUTE, lease_s=self.lease_s, holder=self.holder
            )
        except BaseException:
            self._release(owner)
            raise
        finally:
            self._storing.discard(shell["id"])
        if not kept:
            self._release(owner)
            raise StoreUnavailable(
                "The background response could not be stored (the ledger database is "
                "unavailable, or the key is at its quota of stored responses), so it was not run."
            )
        rid = shell["id"]
        task = asyncio.create_task(self._run(rid, shell, run), name=f"background {rid}")
        self._runs[rid] = task
        # a callback, not a finally: a task cancelled before its first step never runs one
        key_name = getattr(request.state, "key_name", None)
        task.add_done_callback(lambda _: self._ended(rid, owner, key_name, shell["model"]))
        return {**shell, "store": True}

    def _ended(self, rid: str, owner: str | None, key_name: str | None, model: str) -> None:
        self._runs.pop(rid, None)
        self._release(owner)
        if rid in self._begun:
            self._begun.discard(rid)  # its run wrote its row
        elif rid in self._cancelled or not self._stopping:  # its one row, nothing spent
            self._row(key_name, model, 499, "client_gone")
        self._cancelled.discard(rid)

    def _row(self, key_name: str | None, model: str, status: int, error: str) -> None:
        """The ledger row of a background response whose run never reached the cascade."""
        if self._write_row is None:
            return
        ex = Exchange(request_id=uuid.uuid4().hex, endpoint="responses", key_name=key_name)
        ex.asked(model, deferred_tier=TIER)
        ex.failed(status, error)
        self._write_row(ex)

    def _release(self, owner: str | None) -> None:
        left = self._held.get(owner, 0) - 1
        if left > 0:
            self._held[owner] = left
        else:
            self._held.pop(owner, None)

    async def _run(self, rid: str, shell: dict[str, Any], run: Run) -> None:
        try:
            began = {**shell, "status": IN_PROGRESS}
            if not await self.state.advance(rid, began, ROUTE, only_from=(QUEUED,)):
                return  # cancelled (or deleted) before it began
            self._begun.add(rid)
            await run(rid)
        except ProxyError as exc:  # the cascade wrote its row; the response says why
            await self._end(rid, _failed(shell, str(exc), exc.code or exc.type))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background_run_failed", response_id=rid)
            await self._end(rid, _failed(shell, "The background response failed on the proxy."))
        else:  # ended without an answer kept (the store was unavailable at its end)
            await self._end(rid, _failed(shell, "The background response's answer was not kept."))

    async def _end(self, rid: str, response: dict[str, Any]) -> None:
        try:
            await self.state.advance(rid, response, ROUTE, only_from=OPEN)
        except ProxyError as exc:
            log.warning("background_not_ended", response_id=rid, reason=str(exc))

    async def finish(self, rid: str, response: dict[str, Any], route: str) -> bool:
        """The run's answer ``response`` (made by the cascade) in the queued one's place, under
        its id; False when it was cancelled meanwhile (the answer is then dropped)."""
        done = {**response, "id": rid, "background": True}
        return await self.state.advance(rid, done, route, only_from=(IN_PROGRESS,))

    async def cancel(self, request: Caller, rid: str) -> dict[str, Any]:
        """``POST /v1/responses/{rid}/cancel``: see the module's docstring."""
        found = await self.state.visible(request, rid)  # another key's: a 404
        if found.response.get("background") is not True:
            raise BadRequest(
                f"Response '{rid}' is not a background response: only those can be cancelled.",
                param="response_id",
            )
        if found.response.get("status") in OPEN:
            cancelled = {**found.response, "status": CANCELLED}
            if await self.state.advance(rid, cancelled, found.route, only_from=OPEN):
                task = self._runs.get(rid)
                if task is not None:
                    self._cancelled.add(rid)
                    task.cancel()
                return cancelled
            found = await self.state.visible(request, rid)  # it ended meanwhile
        return found.response

    async def ended(self, request: Caller, rid: str, *, wait_s: float) -> dict[str, Any]:
        """The response ``rid`` once it has ended (read every :data:`POLL_S` seconds), or as it
        is after ``wait_s``; another key's: a 404."""
        deadline = time.monotonic() + wait_s
        while True:
            found = await self.state.visible(request, rid)
            if found.response.get("status") not in OPEN or time.monotonic() >= deadline:
                return found.response
            await asyncio.sleep(POLL_S)

    async def stop(self) -> None:
        """Mark ``failed`` the runs this process holds that have begun (each writes its row as
        it is cancelled), then cancel them all; those not begun stay ``queued``, for
        :meth:`start`. Marked first: a cancelled run may take a while to end."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        runs = dict(self._runs)
        for rid in set(self._begun) & set(runs):
            try:
                stored = await self.state.get(rid)
            except ProxyError as exc:
                log.warning("background_not_ended", response_id=rid, reason=str(exc))
                continue
            if stored is not None:
                await self._end(rid, _failed(stored.response, _STOPPED))
        for task in runs.values():
            task.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
        try:  # those never begun: their lease given up, so the next start or sweep fails them
            await self.state.renew(list(runs), 0.0)
        except ProxyError as exc:
            log.warning("background_lease_not_given_up", reason=str(exc))

    async def start(self, write_row: Callable[[Exchange], None]) -> int:
        """At start: mark ``failed`` the background responses a stopped proxy left open whose
        lease has passed, each with one ledger row (``write_row``: the app's one way to write an
        exchange's row, :func:`proxy.serving.record.finish` with its services); how many. Then
        keep this process's leases, and sweep other processes' lapsed ones, in the background."""
        self._write_row = write_row
        marked = await self.sweep(leased=False)
        self._keeper = asyncio.create_task(self._keep_forever(), name="background leases")
        return marked

    async def sweep(self, *, leased: bool = True) -> int:
        """Mark ``failed``, each with its row, the open background responses whose lease has
        lapsed (:func:`lapsed`; ``leased``: only those that hold one); how many. A lease renewed
        meanwhile wins: the move is made only while it still ends by the time judged."""
        try:
            left = await self.state.unfinished(leased=leased)
        except ProxyError as exc:
            log.warning("background_not_recovered", reason=str(exc))
            return 0
        now = time.time()
        marked = 0
        for stored in left:
            by = lapsed(stored, now, self.holder, self._runs.keys() | self._storing)
            if by is None:
                continue
            ended = _failed(stored.response, _STOPPED)
            moved = await self.state.advance(
                stored.id, ended, stored.route, only_from=OPEN, lapsed_at=by
            )
            if not moved:
                continue
            self._row(stored.key_name, str(stored.response.get("model") or ""), 500, _RESTARTED)
            marked += 1
        if marked:
            log.warning("background_marked_failed", count=marked)
        return marked

    async def _keep_forever(self) -> None:
        """Every third of the lease: renew the leases of the responses queued or running here,
        then sweep those whose process died (another replica, killed)."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if self._runs:
                    await self.state.renew(list(self._runs), time.time() + self.lease_s)
                await self.sweep()
            except Exception:  # the database went away: the next tick
                log.exception("background_leases_not_kept")


_RESTARTED = "server_restarted"
_STOPPED = "The proxy stopped before this background response finished; send it again."
