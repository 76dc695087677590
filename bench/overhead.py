"""API pass-through overhead: direct vs frugal vs LiteLLM proxy, side by side in one run.

    .venv/bin/python bench/overhead.py                      # 3 rounds of 8 s per cell
    .venv/bin/python bench/overhead.py --rounds 5 --window 10 --json /tmp/overhead.json
    .venv/bin/python bench/overhead.py --endpoints chat,responses --targets direct,frugal
    git worktree add /tmp/before efff029 && git worktree add /tmp/after HEAD
    .venv/bin/python bench/overhead.py --targets direct,frugal-before,frugal-after \
        --tree before=/tmp/before --tree after=/tmp/after

What runs (all on loopback, started and stopped by this script):

- the upstream: ``bench/upstream_fast.py`` (raw asyncio, canned answers), or with
  ``--upstream fake`` the test suite's ``tests/fake_api.py`` (Starlette on uvicorn);
- ``direct``: wrk straight to the upstream;
- ``frugal``: a real ``frugal serve`` process (engine loaded, ledger on), every request forced to
  the API with ``x-frugal-route: api``, so it takes the direct aiohttp path;
- ``frugal-NAME``: the same from another checkout, ``--tree NAME=PATH`` (a ``git worktree`` of
  another commit, served with this venv), so that two commits are measured side by side;
- ``frugal-litellm``: a second ``frugal serve`` whose ``[fallback.models]`` maps the model to
  ``hosted_vllm/gpt-4o-mini``, so the same requests go through ``litellm.acompletion``;
- ``litellm``: LiteLLM proxy (``litellm --config bench/litellm_config.yaml``, 1 worker, no
  database, a random strong ``master_key``) from a separate venv, ``bench/.venv-litellm``,
  created with ``pip install 'litellm[proxy]'`` when it is missing.

``--endpoints chat,responses`` measures ``POST /v1/responses`` (a short string ``input`` and
``max_output_tokens``) next to ``POST /v1/chat/completions``: ``direct`` posts the same body to the
upstream's own ``/v1/responses``, the proxies are sent ``x-frugal-route: api`` as on chat, and the
report adds each proxy's added latency (minus ``direct``) for both endpoints side by side, per
connection count, with their ratio. ``store`` is left to its default (true: the proxy stores each
response in its ledger database); ``--no-store`` sends ``"store": false`` instead.
``--responses-fallback responses|translate`` sets the proxies' ``[fallback] responses``; the
conditions count the upstream requests they sent per upstream endpoint. LiteLLM proxy
(``litellm``) is measured on chat only. ``chat-stream`` and ``responses-stream`` are the same
requests streamed (``"stream": true``), each timed to its last event, with their own side-by-side
table when both are asked for: ``--endpoints chat,responses,chat-stream,responses-stream``.

Every cell (target x endpoint x connections) is one wrk run of ``--window`` seconds. The wrk
script stops issuing requests at the end of the window and lets the ones in flight finish, so that
the number wrk completed is exactly the number the proxy served: the frugal ledger must then hold
one row of that endpoint (``chat.completions`` or ``responses``) per completed request, which is
checked after each run. Requests per second = completed / window.
Rounds rotate the order of the targets; the tables show the median over rounds and the range.

With two or more CPUs the proxies are pinned to CPU 0 and the upstream and wrk to CPU 1
(``--no-pin`` turns that off), so the proxy under test has a core of its own; the machine may
still be shared with other work, which is why all targets are measured in the same run.

The processes are ``bench/overhead_servers.py``'s; wrk, the cells and the report are
``bench/overhead_measure.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx
from overhead_measure import (
    ENDPOINTS,
    UPSTREAM_KINDS,
    Load,
    Run,
    Target,
    measure,
    report,
    upstream_kind,
)
from overhead_servers import (
    LITELLM_VENV,
    MODEL,
    ROOT,
    UPSTREAM_KEY,
    frugal,
    litellm_proxy,
    runnable_tree,
    upstream,
)

# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=8.0, help="seconds of load per cell")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per target, once")
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--upstream", choices=("fast", "fake"), default="fast")
    parser.add_argument(
        "--endpoints",
        default="chat",
        help="comma-separated: chat (POST /v1/chat/completions), responses (POST /v1/responses), "
        "chat-stream, responses-stream (the same, streamed)",
    )
    parser.add_argument(
        "--responses-fallback",
        choices=("responses", "translate"),
        help="the proxies' [fallback] responses (default: not set, the proxy's own default): "
        "the upstream's /v1/responses, or translated to its Chat Completions",
    )
    parser.add_argument(
        "--no-store",
        action="store_true",
        help='Responses bodies carry "store": false (default: store left to its default, true)',
    )
    parser.add_argument(
        "--targets",
        default="direct,frugal,frugal-litellm,litellm",
        help="comma-separated; also frugal-pg (the proxy on a PostgreSQL ledger) and "
        "frugal-NAME for each --tree NAME=PATH",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout of some commit (git worktree add PATH REV): the frugal-NAME target "
        "serves its proxy/ with this venv; repeat it to compare commits side by side",
    )
    parser.add_argument("--litellm-venv", type=Path, default=LITELLM_VENV)
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument("--json", type=Path, help="also write every cell here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    connections = [int(c) for c in args.connections.split(",")]
    endpoints = tuple(e.strip() for e in args.endpoints.split(",") if e.strip())
    unknown = [e for e in endpoints if e not in ENDPOINTS]
    if unknown or not endpoints:
        raise SystemExit(f"--endpoints: expected some of {', '.join(ENDPOINTS)}, got {unknown}")
    store = not args.no_store
    mode = args.responses_fallback or ""
    multi = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    proxy_cpus, load_cpus = ("0", "1") if multi else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="frugal-overhead-"))
    run = Run()
    run.conditions = {
        "cpus": os.cpu_count(),
        "pinned": multi,
        "upstream": args.upstream,
        "window_s": args.window,
        "rounds": args.rounds,
        "endpoints": list(endpoints),
        "responses_store": store,
        "responses_fallback": args.responses_fallback or "(proxy default)",
        "loadavg_start": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    try:
        with ExitStack() as stack:
            base = stack.enter_context(upstream(args.upstream, load_cpus, tmp))
            direct_url = base.removesuffix("/v1")
            targets: dict[str, Target] = {
                "direct": Target("direct", direct_url, {"authorization": f"Bearer {UPSTREAM_KEY}"})
            }
            if "frugal" in names:
                url, server, db = stack.enter_context(
                    frugal("frugal", base, proxy_cpus, tmp, {}, responses_fallback=mode)
                )
                targets["frugal"] = Target(
                    "frugal", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            for spec in args.tree:
                label, _, path = spec.partition("=")
                name = f"frugal-{label}"
                if name not in names or not path:
                    raise SystemExit(f"--tree {spec}: expected NAME=PATH, and {name} in --targets")
                url, server, db = stack.enter_context(
                    frugal(
                        name,
                        base,
                        proxy_cpus,
                        tmp,
                        {},
                        tree=runnable_tree(Path(path)),
                        responses_fallback=mode,
                    )
                )
                targets[name] = Target(
                    name, url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            if "frugal-pg" in names:
                # The same proxy on a PostgreSQL ledger (a real server in a temporary folder).
                sys.path.insert(0, str(ROOT))
                from tests import pg

                server_pg = stack.enter_context(pg.running())
                if server_pg is None:
                    raise SystemExit("frugal-pg needs PostgreSQL: apt-get install -y postgresql")
                pg_url = server_pg.database()
                url, server, db = stack.enter_context(
                    frugal("frugal-pg", base, proxy_cpus, tmp, {}, pg_url, responses_fallback=mode)
                )
                targets["frugal-pg"] = Target(
                    "frugal-pg", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
                targets["frugal-pg"].ledger_url = pg_url
            if "frugal-litellm" in names:
                mapping = {MODEL: f"hosted_vllm/{MODEL}"}
                url, server, db = stack.enter_context(
                    frugal(
                        "frugal-litellm", base, proxy_cpus, tmp, mapping, responses_fallback=mode
                    )
                )
                targets["frugal-litellm"] = Target(
                    "frugal-litellm", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            if "litellm" in names:
                url, server, key = stack.enter_context(
                    litellm_proxy(base, proxy_cpus, tmp, args.litellm_venv)
                )
                targets["litellm"] = Target(
                    "litellm", url, {"authorization": f"Bearer {key}"}, server
                )
            order = [n for n in names if n in targets]

            def serves(name: str, endpoint: str) -> bool:
                return upstream_kind(endpoint) == "chat" or name != "litellm"

            direct_sent = dict.fromkeys(UPSTREAM_KINDS, 0)  # what wrk sent the upstream itself
            for endpoint in endpoints:  # warm-up: connection pools, caches, lazy imports
                for name in order:
                    if not serves(name, endpoint):
                        continue
                    warm_up = Load(16, args.warmup, load_cpus, tmp, endpoint, store)
                    cell = measure(targets[name], warm_up, 0)
                    if name == "direct":
                        direct_sent[upstream_kind(endpoint)] += cell.requests
                    print(
                        f"warm-up {name} {endpoint}: {cell.requests} requests, "
                        f"{cell.errors} errors",
                        file=sys.stderr,
                    )
                    if cell.ledger_rows not in (None, cell.requests):
                        print(
                            f"  ledger rows {cell.ledger_rows} != {cell.requests}",
                            file=sys.stderr,
                        )
            for round_ in range(1, args.rounds + 1):
                shift = (round_ - 1) % len(order)
                rotated = order[shift:] + order[:shift]
                ends = endpoints[shift % len(endpoints) :] + endpoints[: shift % len(endpoints)]
                for conns in connections:
                    for endpoint, name in ((e, n) for e in ends for n in rotated):
                        if not serves(name, endpoint):
                            continue
                        for server in (t.server for t in targets.values() if t.server):
                            server.check_alive()
                        load = Load(conns, args.window, load_cpus, tmp, endpoint, store)
                        cell = measure(targets[name], load, round_)
                        run.cells.append(cell)
                        if name == "direct":
                            direct_sent[upstream_kind(endpoint)] += cell.requests
                        print(
                            f"round {round_} {name:>14} {endpoint:>9} c={conns:<2} "
                            f"p50={cell.p50_ms:.3f}ms "
                            f"p99={cell.p99_ms:.2f}ms rps={cell.rps:,.0f} err={cell.errors} "
                            f"cpu/req={cell.cpu_ms_per_request or 0:.3f}ms "
                            f"rows={cell.ledger_rows}",
                            file=sys.stderr,
                        )
            if args.upstream == "fast":
                # Which upstream endpoint the proxies' Responses fallback used: what the upstream
                # answered, less what wrk sent it directly (and the one chat request of its
                # readiness check). Translated, a Responses request is an upstream chat request.
                run.conditions["upstream_requests_from_proxies"] = {
                    kind: int(httpx.get(f"{direct_url}/count/{kind}", timeout=5).text)
                    - direct_sent[kind]
                    - (kind == "chat")
                    for kind in UPSTREAM_KINDS
                }
        run.conditions["loadavg_end"] = os.getloadavg()
        print(report(run, order, connections, endpoints))
        print(f"\nconditions: {json.dumps(run.conditions)}")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"conditions": run.conditions, "cells": [c.__dict__ for c in run.cells]},
                    indent=1,
                )
            )
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
