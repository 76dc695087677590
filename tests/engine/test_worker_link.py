"""The worker process as the proxy holds it (worker_link.py): a crash fails its jobs, and another
worker takes its place; the real SmolLM2 in a real worker process."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from proxy.errors import EngineCrashed
from tests.engine.conftest import started
from tests.load_factor import settle

QUESTION = {"role": "user", "content": "Name three colors."}


def _deadline(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


async def test_a_crashed_worker_fails_its_job_and_is_replaced() -> None:
    async with started(n_threads=1) as own:
        pid = own.health()["pid"]
        request = {
            "messages": [{"role": "user", "content": "Write a long poem about the sea."}],
            "max_tokens": 2000,
        }
        job = asyncio.create_task(own.chat(request, deadline=_deadline()))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineCrashed):
            await job
        await settle(lambda: own.state not in ("starting", "restarting"), "the restart's end")
        assert own.state == "ready"
        assert own.health()["pid"] not in (None, pid)
        assert own.stats.crashes == 1 and own.stats.restarts == 1
        again = await own.chat({"messages": [QUESTION], "max_tokens": 4}, deadline=_deadline())
        assert again["usage"]["completion_tokens"] > 0
