"""The load a remote backend's server publishes, and what the predictor makes of it.

    SOURCES       kind name -> the paths its server publishes load on, read in order
    read_load()   one reading of a server's published load (a :class:`Load`), or why not
    Load          running and waiting requests as the server counts them, all clients together
    LoadWatch     keeps a backend's reading current: every ``interval_s`` while the backend is
                  in use (predicted for, or answering), and after each answer

Where each kind publishes its load:

* ``llama-server``: ``GET /metrics`` (started with ``--metrics``), Prometheus text with
  ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred``; and ``GET /slots``, one
  object per slot (``is_processing``, or ``state`` 1 in older builds): the slot count, and the
  running count when ``/metrics`` is off.
* ``vllm``: ``GET /metrics``, ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``
  (one sample per served model, added up).
* ``ollama``: ``GET /api/ps``, the models loaded in memory. Ollama publishes no request
  counts, so its reading names the loaded models and leaves the counts unknown.
* ``llama-cpp-python``, ``frugal``, ``openai-compatible``: nothing is read. llama-cpp-python's
  server publishes no load, and any request that reaches it during a stream cuts that stream.

The predictor adds the *foreign* requests, those other clients sent (published running and
waiting, minus the requests of ours in flight when the reading came back), to the work ahead of
a new request (:func:`with_foreign`). A reading that failed, that has no counts, or that is older
than ``STALE_S`` adds nothing: the prediction is then what it was without published load.
A page is read up to ``PAGE_BYTES``; a bigger one is skipped like an unreadable one.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import httpx
import structlog

from proxy.engine.rates import PendingWork
from proxy.routing.remote_stream import AnswerTooLarge, read_bounded

log = structlog.get_logger(__name__)

__all__ = [
    "SOURCES",
    "STALE_S",
    "Load",
    "LoadWatch",
    "parse_prometheus",
    "read_load",
    "with_foreign",
]

INTERVAL_S = 1.0  # between readings, while the backend is in use
IDLE_S = 10.0  # no prediction or answer for this long: stop reading
STALE_S = 5.0  # a reading older than this is not used
READ_TIMEOUT_S = 1.0
PAGE_BYTES = 1024 * 1024  # the most read of one load page; a bigger one is skipped as unreadable

# Prometheus names of (running, waiting) per kind
_COUNTERS: dict[str, tuple[str, str]] = {
    "llama-server": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
}

SOURCES: dict[str, tuple[str, ...]] = {
    "llama-server": ("/metrics", "/slots"),
    "vllm": ("/metrics",),
    "ollama": ("/api/ps",),
}


class BadLoad(ValueError):
    """A published load that cannot be read: not the format the kind publishes."""


@dataclass(frozen=True, kw_only=True)
class Load:
    """One reading of a server's published load."""

    running: int | None  # requests being answered, every client's
    waiting: int | None  # requests queued behind them
    slots: int | None = None  # requests the server answers at once, when it says
    models: tuple[str, ...] | None = None  # models loaded in memory (Ollama)
    source: str = ""  # the paths read, e.g. "/metrics /slots"
    ours: int = 0  # our requests in flight on it when the reading came back
    at: float = 0.0  # time.monotonic() of the reading

    @property
    def counted(self) -> bool:
        return self.running is not None or self.waiting is not None

    def foreign(self) -> tuple[int, int]:
        """(running, waiting) requests of other clients: ours are taken off the running ones
        first (the server runs what it was sent first), then off the waiting ones."""
        running, waiting = self.running or 0, self.waiting or 0
        ours = self.ours
        off_running = min(ours, running)
        return running - off_running, max(0, waiting - (ours - off_running))

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        running, waiting = self.foreign()
        out: dict[str, Any] = {
            "running": self.running,
            "waiting": self.waiting,
            "slots": self.slots,
            "ours": self.ours,
            "foreign": running + waiting if self.counted else None,
            "source": self.source,
            "age_s": round(max(0.0, now - self.at), 2),
        }
        if self.models is not None:
            out["models"] = list(self.models)
        return out


def parse_prometheus(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The sum of each named metric's samples in Prometheus text, for the names present.
    A sample whose value is not a finite number that is 0 or more is :class:`BadLoad`."""
    found: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):  # name{labels} value [time]
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:  # name value [time]
            name, _, rest = line.partition(" ")
        if name not in names:
            continue
        fields = rest.split()
        if not fields:
            raise BadLoad(f"{name}: a sample with no value")
        try:
            value = float(fields[0])
        except ValueError as exc:
            raise BadLoad(f"{name}: {fields[0][:40]!r} is not a number") from exc
        if not math.isfinite(value) or value < 0:
            raise BadLoad(f"{name}: {fields[0][:40]!r} is not a count")
        found[name] = found.get(name, 0.0) + value
    return found


def _from_metrics(kind: str, text: str) -> dict[str, Any]:
    running_name, waiting_name = _COUNTERS[kind]
    found = parse_prometheus(text, (running_name, waiting_name))
    if not found:
        raise BadLoad(f"no {running_name} or {waiting_name} in /metrics")
    out: dict[str, Any] = {}
    if running_name in found:
        out["running"] = round(found[running_name])
    if waiting_name in found:
        out["waiting"] = round(found[waiting_name])
    return out


def _from_slots(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, list) or not all(isinstance(s, dict) for s in payload):
        raise BadLoad("/slots is not a list of slots")
    busy = 0
    for slot in payload:
        processing = slot.get("is_processing")
        if processing is None:
            processing = slot.get("state") == 1
        busy += bool(processing)
    return {"running": busy, "slots": len(payload)}


def _from_ps(payload: Any) -> dict[str, Any]:
    models = payload.get("models") if isinstance(payload, dict) else None
    if not isinstance(models, list):
        raise BadLoad("/api/ps has no models list")
    names = [m.get("name") or m.get("model") for m in models if isinstance(m, dict)]
    return {"models": tuple(str(n) for n in names if n)}


def parse(kind: str, path: str, body: str) -> dict[str, Any]:
    """What one published page says, as :class:`Load` fields; :class:`BadLoad` when it is not
    what ``kind`` publishes there."""
    if path == "/metrics":
        return _from_metrics(kind, body)
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise BadLoad(f"{path} is not JSON") from exc
    if path == "/slots":
        return _from_slots(payload)
    if path == "/api/ps":
        return _from_ps(payload)
    raise BadLoad(f"no reader for {path}")


def root_of(api_base: str) -> str:
    """The server's root: ``api_base`` without its ``/v1``."""
    return api_base.rstrip("/").removesuffix("/v1")


async def read_load(
    client: httpx.AsyncClient, kind: str, api_base: str, ours: Callable[[], int]
) -> tuple[Load | None, str | None]:
    """Read every page ``kind`` publishes load on: the reading, or None and why not. A page
    that is missing (an HTTP error: llama-server without ``--metrics``) or unreadable is
    skipped while another one gives something."""
    paths = SOURCES.get(kind, ())
    if not paths:
        return None, None
    fields: dict[str, Any] = {}
    read: list[str] = []
    errors: list[str] = []
    root = root_of(api_base)
    for path in paths:
        try:
            async with (
                asyncio.timeout(READ_TIMEOUT_S),
                client.stream("GET", root + path) as response,
            ):
                page = await read_bounded(response.aiter_bytes(), PAGE_BYTES)
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            errors.append(f"{path}: {type(exc).__name__}")
            continue
        if response.status_code != 200:
            errors.append(f"{path}: HTTP {response.status_code}")
            continue
        try:
            found = parse(kind, path, page.decode("utf-8", "replace"))
        except BadLoad as exc:
            errors.append(str(exc))
            continue
        read.append(path)
        for key, value in found.items():
            fields.setdefault(key, value)  # /metrics' counts before /slots'
    if not read:
        return None, "; ".join(errors) or "nothing published"
    load = Load(
        running=fields.get("running"),
        waiting=fields.get("waiting"),
        slots=fields.get("slots"),
        models=fields.get("models"),
        source=" ".join(read),
        ours=ours(),
        at=time.monotonic(),
    )
    return load, "; ".join(errors) or None


def with_foreign(
    pending: PendingWork, load: Load, *, prompt_tokens: float, answer_tokens: float
) -> PendingWork:
    """``pending`` (our own work ahead) plus the foreign requests of ``load``. Their sizes are
    not published, so each is taken as large as the request being predicted: a waiting one
    whole, a running one half done (its prompt read, half its answer left)."""
    running, waiting = load.foreign()
    if running + waiting == 0:
        return pending
    return PendingWork(
        jobs=pending.jobs + running + waiting,
        prefill_tokens=pending.prefill_tokens + waiting * prompt_tokens,
        decode_tokens=pending.decode_tokens + (waiting + running / 2) * answer_tokens,
        decode_tokens_max=pending.decode_tokens_max + (waiting + running / 2) * answer_tokens,
    )


@dataclass(eq=False)  # told apart by identity
class LoadWatch:
    """Keeps one backend's published load current while the backend is in use.

    ``read`` makes one reading. :meth:`used` (from each prediction) starts the readings when
    they are not running, and they stop after ``idle_s`` without use; :meth:`answered` asks
    for one reading now. Readings never overlap, and never outlive :meth:`close`.
    """

    name: str
    read: Callable[[], Awaitable[tuple[Load | None, str | None]]]
    _: KW_ONLY
    interval_s: float = INTERVAL_S
    idle_s: float = IDLE_S
    stale_s: float = STALE_S
    last: Load | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)
    readings: int = field(default=0, init=False)
    _used: float = field(default=0.0, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _now: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _closed: bool = field(default=False, init=False)

    def fresh(self) -> Load | None:
        """The last reading with counts in it, unless it is stale."""
        load = self.last
        if load is None or not load.counted:
            return None
        if time.monotonic() - load.at > self.stale_s:
            return None
        return load

    def used(self) -> None:
        self._used = time.monotonic()
        self._ensure()

    def answered(self) -> None:
        self._used = time.monotonic()
        self._now.set()
        self._ensure()

    def _ensure(self) -> None:
        if self._closed or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._loop(), name=f"load-{self.name}")

    async def _loop(self) -> None:
        while not self._closed and time.monotonic() - self._used < self.idle_s:
            self._now.clear()
            try:
                load, error = await self.read()
            except Exception as exc:  # noqa: BLE001 - a bad reading is no reading
                load, error = None, f"{type(exc).__name__}"
            self.readings += 1
            if error != self.error and error is not None:
                log.info("backend_load_unreadable", backend=self.name, why=error)
            self.last, self.error = load, error
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._now.wait()
            except TimeoutError:
                pass

    async def close(self) -> None:
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)

    def health(self) -> dict[str, Any] | None:
        if self.last is None and self.error is None:
            return None
        out: dict[str, Any] = self.last.as_dict() if self.last is not None else {}
        out["used"] = self.fresh() is not None
        out["error"] = self.error
        return out
