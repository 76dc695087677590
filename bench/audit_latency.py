"""Audits never add latency: the client's p50 with ``[audit] rate = 1`` against ``rate = 0``.

Two in-process apps share one real engine (SmolLM2) and one upstream: the fake API behind the
loopback judge server (``tests/audit/judge_server.py``), so every accepted answer gets a real
shadow call and a real judge call over loopback. Requests alternate between the two apps, one at
a time, so both see the same engine, the same machine load and the same prompts; the figure is
the ratio of the two medians of the client's latency (request sent to response read).

    .venv/bin/python -m bench.audit_latency [--requests 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy import config  # noqa: E402
from proxy.engine.local_engine import LocalEngine  # noqa: E402
from proxy.server.app import create_app  # noqa: E402
from tests.audit.judge_server import JudgeServer  # noqa: E402
from tests.fake_api import FakeAPI  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Name a colour of the sky.",
    "Say hello in Spanish.",
    "What is 2 plus 2?",
    "Give one word for happy.",
]


def settings(tmp: Path, name: str, upstream: str, rate: float) -> config.Settings:
    return config.from_dict(
        {
            "ledger": {"path": str(tmp / f"{name}.db"), "flush_interval_s": 0.05},
            "server": {"api_keys_env": ""},
            "local": {"timeout_s": 30.0, "n_threads": 1},
            "fallback": {"api_base": upstream, "api_key_env": "", "max_retries": 0},
            "audit": {"rate": rate, "monthly_budget_usd": 100.0},
            "pricing": {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}},
        }
    )


async def run(requests: int) -> dict[str, Any]:
    engine = LocalEngine(config.LocalSettings(n_threads=1, timeout_s=30.0))
    await engine.start()
    api = FakeAPI(record=False).start()
    judge = JudgeServer(relay_to=api.url).start()
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            apps = {
                rate: create_app(settings(tmp, f"rate{rate}", judge.url, rate), engine=engine)
                for rate in (0.0, 1.0)
            }
            latencies: dict[float, list[float]] = {0.0: [], 1.0: []}
            async with (
                apps[0.0].router.lifespan_context(apps[0.0]),
                apps[1.0].router.lifespan_context(apps[1.0]),
            ):
                clients = {
                    rate: httpx.AsyncClient(
                        transport=httpx.ASGITransport(app=app),
                        base_url="http://localhost",
                        timeout=60,
                    )
                    for rate, app in apps.items()
                }
                for i in range(requests * 2):
                    rate = (0.0, 1.0)[(i + i // 2) % 2]  # ABBA order: neither always goes first
                    body = {
                        "model": "gpt-4o-mini",
                        "messages": [{"role": "user", "content": PROMPTS[(i // 2) % 5]}],
                        "max_tokens": 12,
                    }
                    started = time.perf_counter()
                    response = await clients[rate].post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"x-frugal-min-quality": "0"},  # accepted: a shadow audit each
                    )
                    latencies[rate].append(time.perf_counter() - started)
                    assert response.status_code == 200, response.text
                audited = apps[1.0].state.services.audit
                pending_seen = audited.sampler.audited
                await audited.sampler.drain(60)
                for client in clients.values():
                    await client.aclose()
    finally:
        judge.stop()
        api.stop()
        await engine.stop()
    p50 = {rate: statistics.median(values) for rate, values in latencies.items()}
    return {
        "requests_each": requests,
        "p50_rate0_ms": round(p50[0.0] * 1000, 1),
        "p50_rate1_ms": round(p50[1.0] * 1000, 1),
        "ratio": round(p50[1.0] / p50[0.0], 3),
        "audits_run": pending_seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="requests per app")
    args = parser.parse_args()
    result = asyncio.run(run(args.requests))
    for key, value in result.items():
        print(f"{key}: {value}")
    verdict = "within" if abs(result["ratio"] - 1) <= 0.05 else "OUTSIDE"
    print(f"p50 with rate = 1 is {verdict} 5% of rate = 0")


if __name__ == "__main__":
    main()
