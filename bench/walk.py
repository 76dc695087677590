"""The walk of one request: which files of ``proxy/`` and ``quality/`` it visits, in order, and
how often it comes back into the HTTP room.

    .venv/bin/python bench/walk.py                               # this checkout
    .venv/bin/python bench/walk.py --order --json /tmp/walk.json # every file, in order, too
    git worktree add /tmp/walk-before be5b0eb
    .venv/bin/python bench/walk.py --tree before=/tmp/walk-before --tree after=/tmp/walk-after

Two requests are served, each once, by the real app (``create_app`` with its lifespan running,
the real local model in its engine worker, a ledger file in a temporary folder), reached through
``httpx.ASGITransport`` with no socket in front: a chat completion and a ``/v1/responses``
request, both sent ``x-frugal-min-quality: 0`` so that the local answer is accepted (the script
checks that ``x-frugal-route`` says ``local``). The fallback's base is ``tests/fake_api.py``,
started on loopback, though a local answer never calls it. Each endpoint is first sent a
different prompt untraced, so that lazy imports and first-time set-ups are not in the walk.

How the walk is taken: a ``sys.setprofile`` hook (and ``threading.setprofile``, installed before
the app starts a thread, for the work it hands to threads) is active only while a ``ContextVar``
holds a walk. A wrapper around the app sets it when the request arrives and closes the walk when
the app returns; tasks the request creates and ``asyncio.to_thread`` calls copy the context, so
their work is in the walk, while the ledger's writer thread and the engine worker process are
not (they serve every request, and the row is written after the answer), nor is work handed to
``loop.run_in_executor``, which does not copy the context (a body over 64 KiB checked in the
body checker's pool: the bodies here are small, checked on the loop). Each fresh call (not a
coroutine resumed after an ``await``) of a function whose file is under the tree's ``proxy/`` or
``quality/`` is a visit. The HTTP room is ``proxy/server/`` where the tree has it, else
``proxy/http/``. Three counts of how often the walk comes back into it:

- *re-entries*: calls into the room from a frame outside it (Starlette's, asyncio's, another
  room's), less one for the request's own arrival;
- *from another room*: those of them whose nearest project frame above (library frames skipped)
  is in another room of the project: a call back up the layers, such as a callback;
- *returns in sequence*: in the order the calls happen, how often a visit in the room follows
  one outside it (the request's arrival not counted), which is what a reader stepping through
  the request sees.

*Room crossings* are the visits whose nearest project frame above is in another room.
Each ``--tree NAME=PATH`` (a ``git worktree`` of another commit) is walked in its own process
with that tree first on ``PYTHONPATH`` and this venv, as ``bench/overhead.py`` does; without
``--tree`` this checkout is walked. The report is a table (per tree and endpoint: visits, files,
files in the HTTP room, rooms, re-entries) and, with ``--json``, every walk with its files in
order of first visit and the calls into each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dis
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import upstream_fast  # a sibling in bench/, the script's folder (stdlib only: safe in a child)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODEL = "gpt-4o-mini"
HEADERS = {"x-frugal-min-quality": "0", "authorization": "Bearer unused-locally"}
ENDPOINTS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "chat": (
        "/v1/chat/completions",
        lambda prompt: {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "temperature": 0,
        },
    ),
    "responses": (
        "/v1/responses",
        lambda prompt: {
            "model": MODEL,
            "input": prompt,
            "max_output_tokens": 16,
            "temperature": 0,
        },
    ),
}
PROMPTS = ("Name a colour of the sky.", "What is the capital of France?")  # warm-up, walked
RESUME = dis.opmap["RESUME"]

# -- the walk (in the child process) -------------------------------------------------------------


@dataclass
class Walk:
    """What one request visited: files in order of first visit, calls into each, re-entries."""

    http_room: str
    order: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    calls_in: list[str] = field(default_factory=list)  # "caller's file -> called file"
    from_rooms: list[str] = field(default_factory=list)  # the same, from another room
    returns: int = 0  # visits that take the sequence back into the HTTP room
    last_inside: bool = False
    entries: int = 0  # visits with no project frame above them
    crossings: int = 0  # visits whose nearest project caller is in another room
    threads: set[str] = field(default_factory=set)
    closed: bool = False


WALKING: contextvars.ContextVar[Walk | None] = contextvars.ContextVar("walking", default=None)


def room_of(rel: str) -> str:
    """``proxy/http/chat.py`` -> ``proxy/http``; ``proxy/errors.py`` -> ``proxy``;
    ``quality/dev/x.py`` -> ``quality``."""
    parts = rel.split("/")
    if parts[0] == "proxy" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def fresh_call(frame: FrameType) -> bool:
    """True for a new call, false for a generator or coroutine resumed (a profile "call" event
    too): the instruction it starts at is RESUME with argument 0, the start of the function."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return at < 0 or (code[at] == RESUME and code[at + 1] == 0)


def library(filename: str) -> str:
    """A file outside the project, shortened: ``starlette/routing.py``, ``asyncio/events.py``."""
    head, sep, tail = filename.rpartition("site-packages/")
    if sep:
        return tail
    return "/".join(Path(filename).parts[-2:])


def make_hook(tree: Path) -> Callable[[FrameType, str, Any], None]:
    roots = (str(tree / "proxy") + os.sep, str(tree / "quality") + os.sep)
    prefix = len(str(tree)) + 1
    known: dict[str, str | None] = {}  # a code's file name -> its path in the tree, or None

    def project(filename: str) -> str | None:
        rel = known.get(filename, "")
        if rel == "":
            rel = filename[prefix:] if filename.startswith(roots) else None
            known[filename] = rel
        return rel

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        walk = WALKING.get()
        if walk is None or walk.closed:
            return
        rel = project(frame.f_code.co_filename)
        if rel is None or not fresh_call(frame):
            return
        walk.threads.add(threading.current_thread().name)
        if rel not in walk.calls:
            walk.order.append(rel)
            walk.calls[rel] = 0
        walk.calls[rel] += 1
        room = room_of(rel)
        inside = room == walk.http_room
        if inside and not walk.last_inside:
            walk.returns += 1
        walk.last_inside = inside
        above = frame.f_back
        direct = None if above is None else project(above.f_code.co_filename)
        if inside and (direct is None or room_of(direct) != room):
            name = "(none)" if above is None else direct or library(above.f_code.co_filename)
            walk.calls_in.append(f"{name} -> {rel}")
        caller = direct
        while caller is None and above is not None:
            above = above.f_back
            caller = None if above is None else project(above.f_code.co_filename)
        if caller is None:
            walk.entries += 1
        elif room != room_of(caller):
            walk.crossings += 1
            if inside:
                walk.from_rooms.append(f"{caller} -> {rel}")

    return hook


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def traced(app: ASGIApp, http_room: str, walks: dict[str, Walk]) -> ASGIApp:
    """The app, with a walk set for the request whose path is in ``walks`` (taken once)."""

    async def wrapper(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        walk = walks.pop(scope.get("path", ""), None) if scope["type"] == "http" else None
        if walk is None:
            await app(scope, receive, send)
            return
        token = WALKING.set(walk)
        try:
            await app(scope, receive, send)
        finally:
            walk.closed = True
            WALKING.reset(token)

    return wrapper


async def walk_tree(upstream: str, ledger: Path) -> dict[str, Any]:
    import httpx

    import proxy

    tree = Path(proxy.__file__).resolve().parents[1]
    http_room = "proxy/server" if (tree / "proxy" / "server").is_dir() else "proxy/http"
    hook = make_hook(tree)
    threading.setprofile(hook)  # before the app starts any thread
    sys.setprofile(hook)
    from proxy import config

    # the app's module by the layout: proxy/server/app.py since issue 40, proxy/http/app.py before
    create_app = importlib.import_module(http_room.replace("/", ".") + ".app").create_app

    settings = config.from_dict(upstream_fast.proxy_settings(upstream, ledger))
    app = create_app(settings)
    pending: dict[str, Walk] = {}
    result: dict[str, Any] = {"tree": str(tree), "http_room": http_room, "walks": {}}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=traced(app, http_room, pending))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", timeout=120
        ) as client:
            for _ in range(600):  # the engine loads its model in its worker
                health = (await client.get("/healthz")).json()
                if health["engine"]["state"] == "ready":
                    break
                await asyncio.sleep(0.2)
            else:
                raise SystemExit(f"engine not ready: {health['engine']}")
            for name, (path, body) in ENDPOINTS.items():
                for prompt in PROMPTS:
                    walk = Walk(http_room)
                    if prompt == PROMPTS[-1]:
                        pending[path] = walk
                    started = time.perf_counter()
                    reply = await client.post(path, json=body(prompt), headers=HEADERS)
                    wall_ms = (time.perf_counter() - started) * 1000
                    route = reply.headers.get("x-frugal-route")
                    if reply.status_code != 200 or route != "local":
                        raise SystemExit(
                            f"{name}: {reply.status_code}, route {route}, "
                            f"reason {reply.headers.get('x-frugal-reason')}: {reply.text[:300]}"
                        )
                if pending:
                    raise SystemExit(f"{name}: the request was not walked")
                result["walks"][name] = summary(walk, wall_ms)
    sys.setprofile(None)
    threading.setprofile(None)
    return result


def summary(walk: Walk, wall_ms: float) -> dict[str, Any]:
    rooms: dict[str, int] = {}
    for rel in walk.order:
        rooms[room_of(rel)] = rooms.get(room_of(rel), 0) + 1
    return {
        "visits": sum(walk.calls.values()),
        "files": len(walk.order),
        "files_in_http_room": rooms.get(walk.http_room, 0),
        # the request's own arrival is the first call into the room, not a re-entry
        "reentries": max(len(walk.calls_in) - 1, 0),
        "reentries_from_other_rooms": len(walk.from_rooms),
        "returns_in_sequence": max(walk.returns - 1, 0),
        "entries": walk.entries,
        "room_crossings": walk.crossings,
        "files_by_room": dict(sorted(rooms.items())),
        "order": walk.order,
        "calls": walk.calls,
        "calls_into_http_room": walk.calls_in,
        "calls_from_other_rooms": walk.from_rooms,
        "threads": sorted(walk.threads),
        "wall_ms_traced": round(wall_ms, 1),
    }


def child(upstream: str) -> int:
    os.environ["BENCH_UPSTREAM_KEY"] = upstream_fast.UPSTREAM_KEY
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with tempfile.TemporaryDirectory(prefix="frugal-walk-") as tmp:
        result = asyncio.run(walk_tree(upstream, Path(tmp) / "ledger.db"))
    print(json.dumps(result))
    return 0


# -- the parent: the fake API, one child per tree, the report ------------------------------------


def run_tree(label: str, tree: Path, upstream: str, log: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", upstream]
    with log.open("wb") as sink:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=sink, env=env, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{label}: the walk exited with {done.returncode}; see {log}:\n{tail}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["name"] = label
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| tree | endpoint | calls | files | in the HTTP room | re-entries: from outside it "
        "| from another room | returns in sequence | room crossings | files by room |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for name, walk in result["walks"].items():
            short = {k.removeprefix("proxy/"): v for k, v in walk["files_by_room"].items()}
            rooms = ", ".join(f"{room} {count}" for room, count in short.items())
            lines.append(
                f"| {result['name']} | {name} | {walk['visits']:,} | {walk['files']} "
                f"| {walk['files_in_http_room']} (`{result['http_room']}/`) "
                f"| {walk['reentries']} | {walk['reentries_from_other_rooms']} "
                f"| {walk['returns_in_sequence']} | {walk['room_crossings']} | {rooms} |"
            )
    return "\n".join(lines)


def orders(results: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for result in results:
        for name, walk in result["walks"].items():
            out.append(f"\n{result['name']} {name}: {walk['files']} files in order of first visit")
            for n, rel in enumerate(walk["order"], 1):
                out.append(f"  {n:>3} {rel} ({walk['calls'][rel]} calls)")
            for hop in walk["calls_into_http_room"]:
                out.append(f"  into the HTTP room: {hop}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout of some commit (git worktree add PATH REV), walked with this venv; "
        "repeat it to compare commits (default: this checkout)",
    )
    parser.add_argument("--json", type=Path, help="also write every walk here")
    parser.add_argument("--order", action="store_true", help="print each walk's files in order")
    parser.add_argument("--child", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)

    sys.path.insert(0, str(BENCH))
    from overhead_servers import runnable_tree, upstream

    trees: list[tuple[str, Path]] = []
    for spec in args.tree or [f"this={ROOT}"]:
        label, _, path = spec.partition("=")
        if not label or not path:
            raise SystemExit(f"--tree {spec}: expected NAME=PATH")
        trees.append((label, runnable_tree(Path(path))))
    tmp = Path(tempfile.mkdtemp(prefix="frugal-walk-"))
    with upstream("fake", None, tmp) as base:
        results = [run_tree(label, tree, base, tmp / f"{label}.log") for label, tree in trees]
    shutil.rmtree(tmp, ignore_errors=True)  # kept, with the logs, when a walk fails
    print(table(results))
    if args.order:
        print(orders(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
