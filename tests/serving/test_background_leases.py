"""When a background response's lease has lapsed (proxy/serving/background_responses.py,
``lapsed``): once its time has passed; at once when its holder was a process of this host that
is gone (a real process, started and reaped), or this process's own name on a response it does
not run (a process before it, with the same pid); never while a live process of this host, or
one of another host, holds it in time, nor for a response this process runs."""

from __future__ import annotations

import os
import subprocess
import sys

from proxy.ledger.responses_store import StoredResponse
from proxy.serving.background_responses import lapsed
from proxy.serving.holders import holder

NOW = 1_790_000_000.0


def _open(until: float | None, owner: str | None, rid: str = "resp_1") -> StoredResponse:
    return StoredResponse(
        id=rid,
        owner=None,
        key_name=None,
        created_at=NOW,
        previous_id=None,
        route="background",
        response={"id": rid, "status": "in_progress", "background": True},
        input_items=[],
        lease_until=until,
        lease_owner=owner,
    )


def test_a_lease_lapses_with_its_time_or_with_its_process_on_this_host() -> None:
    me = holder()
    host = me.rpartition(":")[0]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        later = NOW + 300
        verdicts = {
            "time passed": lapsed(_open(NOW - 1, f"{host}:{alive.pid}"), NOW, me, set()),
            "no lease": lapsed(_open(None, None), NOW, me, set()),
            "holder gone": lapsed(_open(later, f"{host}:{gone.pid}"), NOW, me, set()),
            "my name, not run here": lapsed(_open(later, me), NOW, me, set()),
            "holder alive": lapsed(_open(later, f"{host}:{alive.pid}"), NOW, me, set()),
            "another host": lapsed(_open(later, f"elsewhere:{gone.pid}"), NOW, me, set()),
            "run here": lapsed(_open(NOW - 1, me), NOW, me, {"resp_1"}),
            "parent alive": lapsed(_open(later, f"{host}:{os.getppid()}"), NOW, me, set()),
        }
    finally:
        alive.kill()
        alive.wait()
    assert verdicts == {
        "time passed": NOW,
        "no lease": NOW,
        "holder gone": later,
        "my name, not run here": later,
        "holder alive": None,
        "another host": None,
        "run here": None,
        "parent alive": None,
    }
