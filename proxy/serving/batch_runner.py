"""The batch runner: a long-lived task that drains the ledger's batch lines, local model first,
and sends what the local model did not answer well enough to the upstream's Batch API, together.

**Local slots.** The started runner keeps ``width`` lines running, claiming another as soon
as one ends (:meth:`BatchRunner.run_once`, for tests and tools, runs one round of ``width``
lines instead). Lines are claimed with :meth:`~proxy.ledger.batches.store.BatchStore.claim`,
under a lease of ``lease_s`` that a ticker renews while they run, and each runs through the
injected
:class:`~proxy.serving.batch_lines.LocalAttempt` at once, with the batch's window as its
deadline and ``priority="deferred"``. An accepted answer is finished with route ``local`` and
its ledger row (one transaction, once). A rejected line, or one the local model cannot serve,
stays claimed by the runner (its lease renewed) and waits with the other rejects of its batch.

**Rejects go up together.** Once no line of a batch is left pending (nor running here), its held
rejects are sent as one call of :meth:`proxy.upstream.deferred.Deferred.send` (one upstream
batch per endpoint and model). Each line goes up under its own line id as ``custom_id`` (unique
across the proxy's batches). Before the upload the lines are marked deferred under a handle of
the runner's (``frugal-…``, :meth:`~BatchStore.defer_to_api`); once the upstream has made its
batch, under the upstream's batch id. Each answer is finished with route ``api`` and its ledger
row, priced from the upstream's usage at the batch rate; a second answer for a line is refused
by the store (``AlreadyFinished``) and billed nowhere. Lines the upstream left unanswered (its
batch ``expired``, ``failed``, a 429) are sent again, up to ``max_sends`` times in all; then
they end in the batch's error file as ``upstream_unanswered``.

**After a restart.** :meth:`BatchRunner.start` first looks for deferred lines whose worker is
gone (:func:`~proxy.ledger.batches.handover.take_deferred`; again at each renewal, for a
replica killed since): those under an upstream batch id resume polling that batch
(nothing is sent twice); those still under a runner's handle (the proxy died between marking
them and the upstream making its batch) are released and run again.

**Budgets.** With a :class:`~proxy.serving.batch_lines.Purse`, each line's worst case is
reserved against its key's budget before it is sent, and settled with its cost when it is
finished; a line past the budget is finished with OpenAI's 429 ``insufficient_quota`` body.

**Cancel.** A ``cancelling`` batch's pending lines are never claimed (the store claims only
``in_progress`` batches). Lines running locally finish; its held rejects are released (the
store's sweep, :meth:`~BatchStore.expire`, which the runner calls when idle, ends the batch);
an upstream batch running for it is cancelled, and the answers it had are kept.

**Progress.** :meth:`BatchRunner.gauges` is what ``/metrics`` and ``frugal batches show`` read
of this runner: lines running locally, held, and waiting for the upstream.

Every store call is blocking and runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

import structlog

from proxy.errors import ProxyError
from proxy.ledger.batches.handover import take_deferred
from proxy.ledger.batches.objects import Line, LineResult
from proxy.ledger.batches.store import AlreadyFinished, BatchStore
from proxy.ledger.writing.ledger_row import LedgerRow
from proxy.serving.batch_lines import (
    PRIORITY,
    Accepted,
    Asker,
    LocalAttempt,
    Purse,
    api_result,
    api_row,
    failed,
    local_row,
    over_budget,
    refused_row,
)
from proxy.serving.holders import gone
from proxy.upstream.batch_api import LineResult as UpstreamResult
from proxy.upstream.deferred import Deferred, DeferredLine, DeferredOutcome

log = structlog.get_logger("frugal.batches")
T = TypeVar("T")
HANDLE_PREFIX = "frugal-"
"""A runner's handle on lines it is about to send: never an upstream batch's id."""
WINDOW_S = 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class RunnerGauges:
    """What this runner holds now (the ``/metrics`` gauges; the queued count is the store's)."""

    running: int  # lines in a local attempt
    held: int  # rejects waiting to be sent with the rest of their batch
    upstream: int  # lines sent to the upstream's Batch API, not answered yet
    local_done: int  # lines finished locally since start
    api_done: int  # lines finished with the upstream's answer since start


@dataclass(eq=False)  # a runner is told apart by identity
class BatchRunner:
    """Drains batch lines (see the module's docstring). ``key_name(owner)`` names a batch
    owner's key for its ledger rows and budget (None: no key); ``worker`` names this runner
    on the lines it claims (a random ``runner-…`` name unless given)."""

    store: BatchStore
    local: LocalAttempt
    deferred: Deferred
    _: KW_ONLY
    width: int
    lease_s: float
    max_claims: int | None = None
    idle_s: float = 1.0
    max_sends: int = 3
    purse: Purse | None = None
    key_name: Callable[[str | None], str | None] = lambda owner: owner
    worker: str = field(default_factory=lambda: f"runner-{secrets.token_hex(6)}")
    _running: dict[str, Line] = field(default_factory=dict, init=False)
    _held: dict[str, list[tuple[Line, str]]] = field(default_factory=dict, init=False)
    _upstream: dict[str, Line] = field(default_factory=dict, init=False)
    _sends: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _loop: asyncio.Task[None] | None = field(default=None, init=False)
    _renewer: asyncio.Task[None] | None = field(default=None, init=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _done: dict[str, int] = field(default_factory=lambda: {"local": 0, "api": 0}, init=False)

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume what a previous run left with the upstream, then drain in the background."""
        await self.resume()
        self._stopping.clear()
        self._renewer = asyncio.create_task(self._renew_forever())
        self._loop = asyncio.create_task(self._run_forever())

    async def stop(self) -> None:
        """Stop claiming; give back every claimed line (running or held), pending again. Lines
        with the upstream stay deferred: the next start resumes their batch."""
        self._stopping.set()
        tasks = [t for t in (self._loop, self._renewer, *self._sends) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        mine = [line.id for line in self._running.values()]
        mine += [line.id for held in self._held.values() for line, _ in held]
        self._running.clear()
        self._held.clear()
        if mine:
            await self._call(self.store.release, mine)

    def gauges(self) -> RunnerGauges:
        return RunnerGauges(
            running=len(self._running),
            held=sum(len(h) for h in self._held.values()),
            upstream=len(self._upstream),
            local_done=self._done["local"],
            api_done=self._done["api"],
        )

    async def drain(self) -> None:
        """Run rounds until nothing is left to claim, hold or wait for (for tests and tools)."""
        while await self.run_once() or self._held or self._sends:
            if self._sends:
                await asyncio.wait(set(self._sends), timeout=self.idle_s)

    async def _run_forever(self) -> None:
        """Keep ``width`` lines running locally: a slot that frees is filled by the next claim;
        after each line, the rejects of a batch with nothing left pending or running go up."""
        running: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping.is_set():
                claimed = 0
                try:
                    claimed = await self._fill(running)
                    if not running:
                        await self._flush(everything=not claimed)
                except Exception:  # the database went away: try again after a pause
                    log.exception("batch_runner_round_failed")
                if running:
                    _, _ = await asyncio.wait(
                        running, timeout=self.idle_s, return_when=asyncio.FIRST_COMPLETED
                    )
                    with contextlib.suppress(Exception):
                        await self._flush(everything=False)
                    continue
                if not claimed:
                    with contextlib.suppress(Exception):
                        await self._call(self.store.expire)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.idle_s)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _fill(self, running: set[asyncio.Task[None]]) -> int:
        free = self.width - len(self._running)
        if free <= 0:
            return 0
        lines = await self._call(
            self.store.claim, self.worker, free, lease_s=self.lease_s, max_claims=self.max_claims
        )
        for line in lines:
            self._running[line.id] = line
            task = asyncio.create_task(self._run_local(line))
            running.add(task)
            task.add_done_callback(running.discard)
        return len(lines)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(Exception):  # the database went away: the next tick
                await self._renew()

    async def _renew(self) -> None:
        """Extend the leases of the lines running or held here, and the budget reservations of
        the lines with the upstream."""
        ids = list(self._running) + [ln.id for h in self._held.values() for ln, _ in h]
        ids += list(self._upstream)  # deferred lines keep a lease too (batches/handover.py)
        if ids:
            await self._call(self.store.renew, self.worker, ids, lease_s=self.lease_s)
        if self.purse is not None and self._upstream:
            await self._call(self.purse.renew)
        await self.resume(leased_only=True)  # what a replica killed since left with the upstream

    @staticmethod
    async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- a round -----------------------------------------------------------------------------

    async def run_once(self) -> int:
        """Claim and run one round of lines locally, then send the rejects of every batch with
        nothing left pending; how many lines were claimed."""
        lines = await self._call(
            self.store.claim,
            self.worker,
            self.width,
            lease_s=self.lease_s,
            max_claims=self.max_claims,
        )
        for line in lines:
            self._running[line.id] = line
        await asyncio.gather(*(self._run_local(line) for line in lines))
        await self._flush(everything=not lines)
        return len(lines)

    async def _run_local(self, line: Line) -> None:
        started = time.time()
        batch = await self._call(self.store.get, line.batch_id)
        deadline = float((batch.times.get("expires_at") if batch else None) or started + WINDOW_S)
        try:
            asker = Asker(client=line.owner, key_name=self.key_name(line.owner), line_id=line.id)
            answer = await self.local(
                line.url, line.body, deadline=deadline, priority=PRIORITY, asker=asker
            )
        except Exception as exc:  # the engine failed: the API gets the line
            log.warning("batch_line_local_failed", line=line.id, error=type(exc).__name__)
            answer = None
        self._running.pop(line.id, None)
        if isinstance(answer, Accepted):
            result = LineResult(
                status_code=answer.status_code, request_id=line.id, body=answer.body
            )
            row = local_row(line, answer, key_name=self.key_name(line.owner), started=started)
            await self._finish(line, result, "local", row, counted=answer.counted)
            return
        reason = "local_error" if answer is None else answer.reason
        self._held.setdefault(line.batch_id, []).append((line, reason))

    async def _finish(
        self,
        line: Line,
        result: LineResult,
        route: str,
        row: LedgerRow | None,
        *,
        counted: tuple[int, int] | None = None,
    ) -> bool:
        try:
            await self._call(
                self.store.finish, line.id, result, route=route, row=row, counted=counted
            )
        except AlreadyFinished:
            log.info("batch_line_finished_already", line=line.id)
            return False
        self._done[route] = self._done.get(route, 0) + 1
        return True

    async def _flush(self, *, everything: bool) -> None:
        """Send the held rejects of each batch with no line pending (of every batch, when
        ``everything``); release those of a batch that is no longer running."""
        busy = {line.batch_id for line in self._running.values()}
        for batch_id in list(self._held):
            if batch_id in busy:
                continue
            counts = await self._call(self.store.progress, batch_id)
            if not everything and counts.get("pending", 0):
                continue
            held = sorted(self._held.pop(batch_id), key=lambda pair: pair[0].index)
            batch = await self._call(self.store.get, batch_id)
            if batch is None or batch.status != "in_progress":
                await self._call(self.store.release, [line.id for line, _ in held])
                continue
            lines = [line for line, _ in held]
            reasons = {line.id: reason for line, reason in held}
            self._spawn(self._send(batch_id, lines, reasons, first=None))

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # -- the upstream ------------------------------------------------------------------------

    async def resume(self, *, leased_only: bool = False) -> None:
        """Pick up lines a previous run left with the upstream (see the module's docstring):
        only those whose worker is gone, never a live replica's (:func:`take_deferred`)."""
        found = await self._call(
            take_deferred,
            self.store.pool,
            self.worker,
            lease_s=self.lease_s,
            gone=gone,
            leased_only=leased_only,
        )
        for upstream_id, lines in found.items():
            if not upstream_id or upstream_id.startswith(HANDLE_PREFIX):
                await self._call(self.store.release, [line.id for line in lines])
                log.info("batch_lines_released_unsent", lines=len(lines))
                continue
            by_batch: dict[str, list[Line]] = {}
            for line in lines:
                by_batch.setdefault(line.batch_id, []).append(line)
            for batch_id, own in by_batch.items():
                reasons = {line.id: "low_quality" for line in own}
                self._spawn(self._send(batch_id, own, reasons, first=upstream_id))

    async def _send(
        self, batch_id: str, lines: Sequence[Line], reasons: dict[str, str], *, first: str | None
    ) -> None:
        """Send ``lines`` of one batch upstream until each has an answer or ``max_sends`` ran
        out; with ``first``, the first round resumes that upstream batch instead of sending."""
        started = time.time()
        open_lines = {line.id: line for line in lines}
        held = await self._reserve(open_lines)
        for line in open_lines.values():
            self._upstream[line.id] = line
        try:
            for attempt in range(1, self.max_sends + 1):
                if not open_lines:
                    return
                outcome, first = await self._one_send(batch_id, list(open_lines.values()), first)
                for cid, answer in outcome.results.items():
                    answered = open_lines.pop(cid, None)
                    if answered is None:
                        continue
                    row = api_row(
                        answered,
                        answer,
                        reason=reasons.get(answered.id, "low_quality"),
                        key_name=self.key_name(answered.owner),
                        started=started,
                        attempts=attempt,
                    )
                    await self._finish(answered, api_result(answer), "api", row)
                    await self._settle(held.pop(answered.id, None), answered, answer)
                batch = await self._call(self.store.get, batch_id)
                if batch is None or batch.status != "in_progress":  # cancelled meanwhile
                    await self._call(self.store.release, list(open_lines))
                    open_lines.clear()
            for line in open_lines.values():
                message = f"the upstream did not answer this line after {self.max_sends} sends"
                row = refused_row(
                    line,
                    status=502,
                    reason="error",
                    error="upstream_unanswered",
                    key_name=self.key_name(line.owner),
                    started=started,
                )
                await self._finish(line, failed("upstream_unanswered", message), "api", row)
        finally:
            for line_id in [*open_lines, *(line.id for line in lines)]:
                self._upstream.pop(line_id, None)
            for line_id, reservation in held.items():
                await self._settle(reservation, lines_by_id(lines)[line_id], None)

    async def _one_send(
        self, batch_id: str, lines: list[Line], resume_id: str | None
    ) -> tuple[DeferredOutcome, str | None]:
        """One upstream round for ``lines``: resume ``resume_id``, or mark and send them; what
        came back, and the upstream batch to resume next round. A failure leaves the lines
        unanswered; once the upstream has made their (one) batch, the next round polls that
        batch again instead of sending them twice."""
        sent = [DeferredLine(custom_id=line.id, url=line.url, body=line.body) for line in lines]
        handle = f"{HANDLE_PREFIX}{secrets.token_hex(8)}"
        made: list[str] = []

        async def submitted(upstream_id: str, ids: tuple[str, ...]) -> None:
            made.append(upstream_id)
            await self._call(self.store.defer_to_api, list(ids), upstream_id)

        watch = asyncio.create_task(self._watch_cancel(batch_id, sent, made))
        try:
            if resume_id is not None:
                made.append(resume_id)
                return await self.deferred.resume(resume_id, sent, request_id=handle), None
            await self._call(self.store.defer_to_api, [line.id for line in lines], handle)
            return await self.deferred.send(sent, request_id=handle, submitted=submitted), None
        except ProxyError as exc:
            log.warning("batch_upstream_failed", batch=batch_id, error=exc.code, made=made)
            again = made[0] if len(made) == 1 else None
            return DeferredOutcome(unanswered=tuple(line.id for line in lines)), again
        finally:
            watch.cancel()

    async def _watch_cancel(self, batch_id: str, sent: list[DeferredLine], made: list[str]) -> None:
        """While an upstream batch runs: cancel it once the client cancels the batch."""
        while True:
            await asyncio.sleep(self.idle_s)
            batch = await self._call(self.store.get, batch_id)
            if batch is not None and batch.status == "in_progress":
                continue
            for upstream_id in made:
                with contextlib.suppress(ProxyError, ValueError):
                    await self.deferred.cancel(upstream_id, sent, request_id=upstream_id)
            return

    async def _reserve(self, lines: dict[str, Line]) -> dict[str, Any]:
        """Reserve each line's worst case; a line past its key's budget is finished with the
        429 and dropped from ``lines``. The reservations by line id."""
        held: dict[str, Any] = {}
        if self.purse is None:
            return held
        for line in list(lines.values()):
            key = self.key_name(line.owner)
            if key is None:
                continue
            got = await self._call(self.purse.reserve, line, key)
            if got is None:
                lines.pop(line.id)
                row = refused_row(
                    line,
                    status=429,
                    reason="budget_exhausted",
                    error="insufficient_quota",
                    key_name=key,
                    started=time.time(),
                )
                await self._finish(line, over_budget(key), "api", row)
            elif got is not True:
                held[line.id] = got
        return held

    async def _settle(self, held: Any, line: Line, answer: UpstreamResult | None) -> None:
        if held is not None and self.purse is not None:
            await self._call(self.purse.settle, held, line, answer)


def lines_by_id(lines: Sequence[Line]) -> dict[str, Line]:
    return {line.id: line for line in lines}
