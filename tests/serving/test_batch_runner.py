"""The batch runner (proxy/serving/batch_runner.py) against real parts: the ledger's batch store
on a SQLite file and on a real PostgreSQL, the fake API's Files and Batch APIs on loopback
(tests/fake_batch.py), and the proxy's own upstream client. The local attempt is an injected
function here (the runner's own logic: which lines it accepts is the test's choice); the
cascade supplies the real one (plan, engine, gate).

Covered: accepted lines finished locally and rejects sent upstream as one batch, every
custom_id once in the client's order, one ledger row per line, API lines priced at the batch
rate; an expired upstream batch whose unanswered lines are sent once more; a runner killed with
SIGKILL after its lines were deferred, whose upstream batch a new runner resumes instead of
sending again; a batch cancelled mid-way; a key past its budget. One test runs the lines through
the real bundled engine and its real quality gate (:class:`EngineAttempt`, a stand-in for the
cascade's attempt until it supplies its own)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.config import BatchSettings, FallbackSettings
from proxy.engine.local_engine import LocalEngine
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.objects import Line
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import Price, PriceBook, pico_per_token
from proxy.ledger.tenants.budgets import Budgets
from proxy.serving.batch_lines import (
    Accepted,
    Asker,
    Attempted,
    CannotServe,
    LedgerPurse,
    Rejected,
)
from proxy.serving.batch_runner import BatchRunner
from proxy.upstream.client import Upstream
from proxy.upstream.deferred import Deferred
from tests.conftest import module_api
from tests.fake_api import FakeAPI

KEY_ENV = "FRUGAL_TEST_RUNNER_KEY"
KEY = "sk-test-runner-0123456789"
CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
PRICES = PriceBook({}, {MODEL: Price(input=pico_per_token(0.15), output=pico_per_token(0.6))})
ROOT = Path(__file__).resolve().parents[2]

api = module_api()


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api.reset()
    monkeypatch.setenv(KEY_ENV, KEY)


def request(i: int) -> dict[str, Any]:
    return {
        "custom_id": f"task-{i}",
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}]},
    }


def make_batch(pool: Pool, n: int, owner: str | None = "id:1") -> str:
    files = FileStore(pool, quota_bytes=10**9)
    content = "".join(json.dumps(request(i)) + "\n" for i in range(n)).encode()
    upload = files.put(owner, purpose="batch", filename="in.jsonl", content=content)
    return BatchStore(pool, prices=PRICES).create(owner, input_file_id=upload.id, endpoint=CHAT).id


def index_of(body: dict[str, Any]) -> int:
    content = body["messages"][0]["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    return int(text.split()[-1])


class Local:
    """The injected local attempt: notes what it was asked (each line's index, deadline and
    class, and its asker), awaits ``before`` (a test's hook, given the index: it may hold a line
    or act in the middle of a batch), then decides: accepts the lines whose index is in
    ``accept``, cannot serve those in ``cannot``, rejects the rest. A subclass decides otherwise
    in :meth:`decide`."""

    def __init__(
        self,
        accept: set[int] | frozenset[int] = frozenset(),
        cannot: frozenset[int] = frozenset(),
        before: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.accept, self.cannot, self.before = accept, cannot, before
        self.asked: list[tuple[int, float, str]] = []
        self.askers: dict[int, Asker | None] = {}

    async def __call__(
        self,
        url: str,
        body: dict[str, Any],
        *,
        deadline: float,
        priority: str,
        asker: Asker | None = None,
    ) -> Attempted:
        i = index_of(body)
        self.asked.append((i, deadline, priority))
        self.askers[i] = asker
        if self.before is not None:
            await self.before(i)
        return await self.decide(i, body, deadline)

    async def decide(self, i: int, body: dict[str, Any], deadline: float) -> Attempted:
        if i in self.cannot:
            return CannotServe(reason="unsupported")
        if i not in self.accept:
            return Rejected(reason="low_quality")
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        answer = {
            "object": "chat.completion",
            "model": MODEL,
            "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"a{i}"}}],
        }
        return Accepted(status_code=200, body=answer, usage=usage, counted=(9, 4))


@asynccontextmanager
async def sender(api: FakeAPI) -> AsyncIterator[Deferred]:
    fallback = FallbackSettings(
        api_base=api.url, api_key_env=KEY_ENV, timeout_s=5.0, connect_timeout_s=1.0
    )
    settings = BatchSettings(poll_interval_s=0.01, max_poll_interval_s=0.05)
    async with Upstream(fallback, backoff_s=0.01) as upstream:
        yield Deferred(upstream, settings)


def runner(pool: Pool, local: Any, deferred: Deferred, **kw: Any) -> BatchRunner:
    store = BatchStore(pool, prices=PRICES)
    width, lease_s = kw.pop("width", 8), kw.pop("lease_s", 60.0)
    return BatchRunner(store, local, deferred, width=width, lease_s=lease_s, idle_s=0.05, **kw)


def output(pool: Pool, batch_id: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    files = FileStore(pool, quota_bytes=10**9)
    batch = BatchStore(pool).get(batch_id)
    assert batch is not None

    def read(file_id: str | None) -> list[dict[str, Any]]:
        content = files.content(file_id) if file_id else b""
        return [json.loads(x) for x in (content or b"").decode().splitlines()]

    return batch.status, read(batch.output_file_id), read(batch.error_file_id)


def rows(pool: Pool) -> list[tuple[Any, ...]]:
    with pool.transaction() as tx:
        return tx.rows(
            "SELECT request_id, route, reason, prompt_tokens, completion_tokens, api_cost_pusd, "
            "service_tier, deferred_tier, counterfactual_cost_pusd FROM requests "
            "ORDER BY request_id"
        )


def batch_cost(prompt: int, completion: int) -> int:
    price = PRICES.price(MODEL, "batch")
    assert price is not None
    return prompt * price.input + completion * price.output


# -- accepted locally, rejects together ----------------------------------------------------------


async def test_rejects_reach_the_upstream_as_one_batch_and_every_line_is_answered_once(
    api: FakeAPI, pool: Pool
) -> None:
    batch_id = make_batch(pool, 8)
    local = Local(accept={0, 2, 3, 6}, cannot=frozenset({5}))
    async with sender(api) as deferred:
        work = runner(pool, local, deferred, width=3)
        await work.drain()
        print("gauges", work.gauges())
    assert sorted(i for i, _, _ in local.asked) == list(range(8))  # each line tried locally once
    assert {p for _, _, p in local.asked} == {"deferred"}
    assert all(d > time.time() + 23 * 3600 for _, d, _ in local.asked)  # the batch's window
    assert api.batches_made == 1 and api.single_calls == 0
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == [f"task-{i}" for i in range(8)]
    sent = [cid for cid, _, _ in api.batch_lines]
    by_id = {line["id"]: int(line["custom_id"].split("-")[1]) for line in out}
    assert [by_id[cid] for cid in sent] == [1, 4, 5, 7]  # the rejects, in order, once each
    # Each line was asked for as its batch owner's (its key's share, its audit's purse).
    assert {
        line_id: Asker(client="id:1", key_name="id:1", line_id=line_id) for line_id in by_id
    } == {line_id: local.askers[i] for line_id, i in by_id.items()}
    found = rows(pool)
    assert sorted(r[0] for r in found) == sorted(by_id)
    for request_id, route, reason, prompt, completion, cost, tier, deferred_tier, saved in found:
        i = by_id[request_id]
        assert (tier, deferred_tier) == ("batch", "batch")
        if i in {0, 2, 3, 6}:
            assert (route, reason, cost) == ("local", "accepted", 0)
            assert saved == batch_cost(9, 4)  # the counted tokens, at the batch rate
        else:
            assert route == "api" and reason == ("unsupported" if i == 5 else "low_quality")
            usage = next(x for x in out if x["id"] == request_id)["response"]["body"]["usage"]
            assert (prompt, completion) == (usage["prompt_tokens"], usage["completion_tokens"])
            assert cost == batch_cost(prompt, completion) > 0
    standard = PRICES.price(MODEL)
    assert standard is not None and batch_cost(2, 2) * 2 == 2 * (standard.input + standard.output)
    assert work.gauges().local_done == 4 and work.gauges().api_done == 4


async def test_an_expired_upstream_batch_has_its_unanswered_lines_sent_once_more(
    api: FakeAPI, pool: Pool
) -> None:
    batch_id = make_batch(pool, 4)
    api.set(batch_expire_after=1)  # each upstream batch answers its first line only
    async with sender(api) as deferred:
        await runner(pool, Local(accept={0, 3}), deferred).drain()
    assert api.batches_made == 2 and api.single_calls == 0
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    ids = {line["custom_id"]: line["id"] for line in out}
    assert [cid for cid, _, _ in api.batch_lines] == [ids["task-1"], ids["task-2"], ids["task-2"]]
    assert [line["custom_id"] for line in out] == [f"task-{i}" for i in range(4)]
    assert sorted(r[0] for r in rows(pool)) == sorted(ids.values())


async def test_a_started_runner_refills_a_slot_as_a_line_ends_and_stop_gives_lines_back(
    api: FakeAPI, pool: Pool
) -> None:
    """Width 2, and line 0 runs until the test lets it go: every other line passes through the
    second slot meanwhile. Stopped while line 0 runs, the runner gives it back, pending, and a
    new runner finishes it (its rejects with the rest, as one upstream batch)."""
    batch_id = make_batch(pool, 6)
    store = BatchStore(pool, prices=PRICES)
    hold = asyncio.Event()

    async def hold_line_0(i: int) -> None:
        if i == 0 and not hold.is_set():
            await hold.wait()

    local = Local(accept={1, 2, 3}, before=hold_line_0)
    async with sender(api) as deferred:
        work = runner(pool, local, deferred, width=2)
        await work.start()

        async def all_asked() -> None:
            while len(local.asked) < 6:
                await asyncio.sleep(0.01)

        with contextlib.suppress(TimeoutError):  # a generous bound, never a timing assertion
            await asyncio.wait_for(all_asked(), 60)
        assert sorted(i for i, _, _ in local.asked) == list(range(6))
        assert work.gauges().running == 1 and work.gauges().held == 2
        await work.stop()
        assert work.gauges().running == 0
        assert store.progress(batch_id)["pending"] == 3  # line 0 and the two held rejects
        assert api.batches_made == 0
        hold.set()
        await runner(pool, local, deferred).drain()
    status, out, _ = output(pool, batch_id)
    assert status == "completed" and [x["custom_id"] for x in out] == [
        f"task-{i}" for i in range(6)
    ]
    assert api.batches_made == 1 and len(api.batch_lines) == 3


async def test_two_replicas_draining_one_batch_answer_every_line_once(
    api: FakeAPI, pool: Pool, database: Database
) -> None:
    """Two runners (two workers, two pools on one database: replicas) drain one batch at once:
    each line is run locally by one of them, every reject reaches the upstream once, and the
    output and the ledger hold each line once."""
    batch_id = make_batch(pool, 24)
    other = Pool(database, size=4, timeout_s=10.0)
    try:
        one, two = Local(accept=set(range(0, 24, 3))), Local(accept=set(range(0, 24, 3)))
        async with sender(api) as deferred:
            first = runner(pool, one, deferred, width=3, worker="replica-1")
            second = runner(other, two, deferred, width=3, worker="replica-2")
            await asyncio.gather(first.drain(), second.drain())
    finally:
        other.close()
    asked = sorted(i for i, _, _ in one.asked + two.asked)
    print("replica 1 ran", len(one.asked), "replica 2 ran", len(two.asked))
    assert asked == list(range(24))
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == [f"task-{i}" for i in range(24)]
    sent = [cid for cid, _, _ in api.batch_lines]
    assert len(sent) == len(set(sent)) == 16 and api.single_calls == 0
    assert sorted(r[0] for r in rows(pool)) == sorted(line["id"] for line in out)


# -- a runner killed with its lines at the upstream ----------------------------------------------

_WORKER = """
import asyncio, os, sys, time
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from tests.serving.test_batch_runner import PRICES, KEY_ENV, Local, sender, runner
from tests.fake_api import FakeAPI

class Remote:
    url = sys.argv[2]

async def main() -> None:
    pool = Pool(parse(sys.argv[1]))
    store = BatchStore(pool, prices=PRICES)
    async with sender(Remote()) as deferred:
        work = runner(pool, Local(accept={0}), deferred)
        await work.start()
        while True:
            ids = [k for k in store.deferred() if not k.startswith("frugal-")]
            if ids:
                print("deferred", ids[0], flush=True)
                await asyncio.sleep(600)
            await asyncio.sleep(0.02)

asyncio.run(main())
"""


async def test_a_runner_killed_after_sending_leaves_a_batch_a_new_runner_resumes(
    api: FakeAPI, pool: Pool, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner process sends its three rejects upstream (the upstream batch holds them for a
    while) and is killed with SIGKILL once its lines are deferred under the upstream's batch
    id. A new runner resumes polling that batch: nothing is sent again, every line is answered
    once and has one ledger row."""
    batch_id = make_batch(pool, 4)
    api.set(batch_seconds=3.0)
    target = database.url if database.is_postgres else database.path
    with subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(target), api.url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        assert worker.stdout is not None
        said = ""
        while not said.startswith("deferred "):  # the runner's own log lines come first
            said = await asyncio.to_thread(worker.stdout.readline)
            assert said, "the worker ended before it deferred its lines"
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    assert said.split()[0] == "deferred"
    upstream_id = said.split()[1]
    assert api.batches_made == 1
    store = BatchStore(pool, prices=PRICES)
    assert list(store.deferred()) == [upstream_id]
    assert len(store.deferred()[upstream_id]) == 3
    local = Local(accept=set())
    async with sender(api) as deferred:
        await runner(pool, local, deferred).drain()  # drain() starts with nothing to claim
        work = runner(pool, local, deferred)
        await work.resume()
        await work.drain()
    assert local.asked == []  # the resumed lines are not run again
    assert api.batches_made == 1 and api.single_calls == 0
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == [f"task-{i}" for i in range(4)]
    assert [r[1] for r in rows(pool)].count("api") == 3
    assert sorted(r[0] for r in rows(pool)) == sorted(line["id"] for line in out)


async def test_an_upstream_batch_whose_poll_failed_is_polled_again_not_sent_again(
    api: FakeAPI, pool: Pool
) -> None:
    """The upstream has made the batch of the rejects, then refuses one poll: the runner's next
    round polls the same upstream batch again instead of sending the lines a second time."""
    batch_id = make_batch(pool, 3)
    store = BatchStore(pool, prices=PRICES)
    api.set(batch_seconds=1.0)
    async with sender(api) as deferred:
        draining = asyncio.create_task(runner(pool, Local(accept={0}), deferred).drain())
        while not [k for k in store.deferred() if not k.startswith("frugal-")]:
            await asyncio.sleep(0.01)
        api.set(fail_status=400, fail_times=1)  # the next poll is refused
        await asyncio.wait_for(draining, 60)
    assert api.fail_times == 0  # the refusal was used
    assert api.batches_made == 1 and len(api.batch_lines) == 2
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == ["task-0", "task-1", "task-2"]
    assert len(rows(pool)) == 3


async def test_lines_marked_for_an_upload_that_never_happened_are_run_again(
    api: FakeAPI, pool: Pool
) -> None:
    """A runner died after marking two rejects with its own handle and before the upstream made
    their batch: the next runner gives them back and runs them again; the rejects go up once."""
    batch_id = make_batch(pool, 3)
    store = BatchStore(pool, prices=PRICES)
    dead = store.claim("dead", 2, lease_s=600)
    assert store.defer_to_api([line.id for line in dead], "frugal-0123456789abcdef") == 2
    local = Local(accept={0})
    async with sender(api) as deferred:
        work = runner(pool, local, deferred)
        await work.resume()
        await work.drain()
    assert sorted(i for i, _, _ in local.asked) == [0, 1, 2]
    assert store.deferred() == {}
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == ["task-0", "task-1", "task-2"]
    assert api.batches_made == 1 and len(api.batch_lines) == 2 and len(rows(pool)) == 3


# -- cancel --------------------------------------------------------------------------------------


async def test_a_batch_cancelled_mid_way_finishes_its_running_lines_and_starts_no_more(
    api: FakeAPI, pool: Pool
) -> None:
    """The client cancels while the runner's second line runs locally: the two running lines
    finish, the rest are never started (in the error file as ``batch_cancelled``), and the batch
    ends ``cancelled``."""
    batch_id = make_batch(pool, 6)
    store = BatchStore(pool, prices=PRICES)

    async def cancel_at_line_1(i: int) -> None:
        if i == 1:
            await asyncio.to_thread(store.cancel, batch_id)

    local = Local(accept=set(range(6)), before=cancel_at_line_1)
    async with sender(api) as deferred:
        work = runner(pool, local, deferred, width=2)
        await work.drain()
        store.expire()
    assert sorted(i for i, _, _ in local.asked) == [0, 1]
    status, out, errors = output(pool, batch_id)
    assert status == "cancelled"
    assert [line["custom_id"] for line in out] == ["task-0", "task-1"]
    # The lines never started are in the error file as batch_cancelled: each custom_id once.
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        (f"task-{i}", "batch_cancelled") for i in range(2, 6)
    ]
    assert store.progress(batch_id)["cancelled"] == 4
    assert len(rows(pool)) == 2 and api.batches_made == 0


async def test_a_cancelled_batch_cancels_its_upstream_batch(api: FakeAPI, pool: Pool) -> None:
    """Rejects at the upstream (its batch held in progress), then the client cancels: the
    runner cancels the upstream batch, and the batch ends ``cancelled``, nothing billed."""
    batch_id = make_batch(pool, 3)
    store = BatchStore(pool, prices=PRICES)
    api.set(batch_seconds=30.0)
    async with sender(api) as deferred:
        work = runner(pool, Local(accept=set()), deferred)
        draining = asyncio.create_task(work.drain())
        while not [k for k in store.deferred() if not k.startswith("frugal-")]:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(store.cancel, batch_id)
        await asyncio.wait_for(draining, 60)
        store.expire()
    cancels = [r for r in api.requests if r.path.endswith("/cancel")]
    assert len(cancels) == 1
    status, out, errors = output(pool, batch_id)
    assert status == "cancelled" and out == []
    assert [line["error"]["code"] for line in errors] == ["batch_cancelled"] * 3
    assert store.progress(batch_id)["cancelled"] == 3 and rows(pool) == []


# -- budgets -------------------------------------------------------------------------------------


async def test_a_line_past_its_keys_budget_fails_with_insufficient_quota(
    api: FakeAPI, pool: Pool
) -> None:
    """A key whose budget holds one line's worst case: the first reject is sent and settled at
    its cost, the second gets OpenAI's 429 insufficient_quota; nothing stays reserved."""
    batch_id = make_batch(pool, 2)
    first = Line(
        id="x",
        batch_id=batch_id,
        owner="id:1",
        index=0,
        custom_id="task-0",
        method="POST",
        url=CHAT,
        body=request(0)["body"],
        claims=1,
    )
    budgets = Budgets(pool)
    one = LedgerPurse(budgets, PRICES, lambda key: None, ttl_s=60.0).worst_case(first)
    purse = LedgerPurse(budgets, PRICES, lambda key: one + one // 2, ttl_s=60.0)
    async with sender(api) as deferred:
        await runner(pool, Local(accept=set()), deferred, purse=purse).drain()
    status, out, errors = output(pool, batch_id)
    assert [line["custom_id"] for line in out] == ["task-0"]
    assert [line["custom_id"] for line in errors] == ["task-1"]
    refused = errors[0]["response"]
    assert refused["status_code"] == 429
    assert refused["body"]["error"]["code"] == "insufficient_quota"
    found = rows(pool)
    assert sorted(r[2] for r in found) == ["budget_exhausted", "low_quality"]
    with pool.transaction() as tx:
        spent = tx.rows("SELECT key_name, spent_pusd, reserved_pusd FROM key_spend")
    api_cost = next(r[5] for r in found if r[1] == "api")
    assert spent == [("id:1", api_cost, 0)] and api_cost > 0
    assert api.batches_made == 1 and len(api.batch_lines) == 1


# -- the real engine and gate --------------------------------------------------------------------


class EngineAttempt(Local):
    """A local attempt on the real bundled engine, gated by its real quality score against
    ``threshold`` (``[quality] threshold``'s default); a line with an image is one the local
    text model cannot serve."""

    def __init__(self, engine: LocalEngine, threshold: float = 0.6) -> None:
        super().__init__()
        self.engine, self.threshold = engine, threshold
        self.scores: dict[int, float | None] = {}

    async def decide(self, i: int, body: dict[str, Any], deadline: float) -> Attempted:
        if isinstance(body["messages"][0]["content"], list):
            return CannotServe(reason="unsupported")
        started = time.monotonic()
        answer = await self.engine.chat(dict(body), deadline=started + (deadline - time.time()))
        value = answer["frugal"]["quality"]["value"]
        self.scores[i] = value
        local_ms = (time.monotonic() - started) * 1000.0
        if value is None or value < self.threshold:
            return Rejected(reason="low_quality", local_ms=local_ms)
        shown = {k: v for k, v in answer.items() if k != "frugal"}
        return Accepted(status_code=200, body=shown, usage=answer.get("usage"), local_ms=local_ms)


async def test_lines_run_on_the_real_engine_and_gate_and_the_rest_go_up_as_one_batch(
    api: FakeAPI, pool: Pool, engine: LocalEngine, database: Database
) -> None:
    """Three questions for the real engine (its gate decides which are kept) and two lines
    with an image, which it cannot serve: whatever the gate rejected and the two image lines
    reach the fake as one batch; every line is answered once, in order."""
    if database.is_postgres:
        pytest.skip("the engine's path is the same on either backend; run once")
    questions = ["What is the capital of France?", "Name three primary colors.", "What is 2+2?"]
    image = [
        {"type": "text", "text": "question 9"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    lines = []
    for i, text in enumerate(questions):
        body = {
            "model": MODEL,
            "max_tokens": 24,
            "temperature": 0,
            "messages": [{"role": "user", "content": f"{text} question {i}"}],
        }
        lines.append({"custom_id": f"task-{i}", "method": "POST", "url": CHAT, "body": body})
    for i in (3, 4):
        body = {"model": MODEL, "messages": [{"role": "user", "content": image}]}
        lines.append({"custom_id": f"task-{i}", "method": "POST", "url": CHAT, "body": body})
    files = FileStore(pool, quota_bytes=10**9)
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    upload = files.put("id:1", purpose="batch", filename="in.jsonl", content=content)
    batch_id = (
        BatchStore(pool, prices=PRICES).create("id:1", input_file_id=upload.id, endpoint=CHAT).id
    )
    local = EngineAttempt(engine)
    async with sender(api) as deferred:
        await runner(pool, local, deferred, width=4).drain()
    print("gate scores", local.scores)
    kept = sorted(i for i, v in local.scores.items() if v is not None and v >= 0.6)
    status, out, errors = output(pool, batch_id)
    assert status == "completed" and errors == []
    assert [line["custom_id"] for line in out] == [f"task-{i}" for i in range(5)]
    by_id = {line["id"]: int(line["custom_id"].split("-")[1]) for line in out}
    sent = [by_id[cid] for cid, _, _ in api.batch_lines]
    assert sent == [i for i in range(5) if i not in kept]
    assert api.batches_made == 1 and api.single_calls == 0
    routes = {by_id[r[0]]: r[1] for r in rows(pool)}
    assert routes == {i: "local" if i in kept else "api" for i in range(5)}


async def test_a_reservation_is_kept_while_its_line_waits_for_the_upstream(
    api: FakeAPI, pool: Pool
) -> None:
    """A line's reservation outlives its ttl while the upstream batch runs (the runner renews
    it): the sweep that would release an abandoned one leaves it; settled once answered."""
    batch_id = make_batch(pool, 1)
    budgets = Budgets(pool)
    purse = LedgerPurse(budgets, PRICES, lambda key: 10**15, ttl_s=0.3)
    store = BatchStore(pool, prices=PRICES)
    api.set(batch_seconds=2.0)  # the upstream holds the batch for several ttls
    async with sender(api) as deferred:
        work = runner(pool, Local(accept=set()), deferred, purse=purse, lease_s=0.3)
        await work.start()
        while not [k for k in store.deferred() if not k.startswith("frugal-")]:
            await asyncio.sleep(0.01)
        seen, swept, late = time.monotonic(), [], False
        while store.deferred():
            await asyncio.sleep(0.1)
            swept.append(await asyncio.to_thread(budgets.sweep))
            with pool.transaction() as tx:
                (reserved,) = tx.rows("SELECT reserved_pusd FROM key_spend")[0]
            if store.deferred():  # still with the upstream: still reserved
                assert reserved > 0
                late = late or time.monotonic() - seen > 3 * 0.3  # swept past several ttls
        await work.stop()
    print("sweeps", len(swept))
    assert sum(swept) == 0 and late
    status, _, _ = output(pool, batch_id)
    assert status == "completed"
    with pool.transaction() as tx:
        assert tx.rows("SELECT reserved_pusd FROM key_spend") == [(0,)]
