"""Local backends other than the bundled engine: remote llama.cpp servers, their rates, their
queue, and what happens when one stops answering.

The remote is played by ``httpx.MockTransport`` (unit tests), by the fake API (a server that can
hang), and by a second real ``frugal serve`` (marked ``serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import config
from proxy.config.secrets import MARK
from proxy.engine.local_engine import Ask, LocalEngine
from proxy.engine.rates import Rates
from proxy.errors import ConfigError, EngineCrashed, EngineTimeout
from proxy.routing.base import Backend, BackendDown
from proxy.routing.estimator import AnswerLengths, Prediction
from proxy.routing.pool import BackendPool
from proxy.routing.remote import RemoteBackend
from tests.conftest import settings_for
from tests.fake_api import FakeAPI

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
REQUEST = {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 8}
ACCEPT_ANY = {"x-frugal-min-quality": "0"}
PRIOR = Rates(prefill_tok_s=100.0, decode_tok_s=10.0, source="requests")
Handler = Callable[[httpx.Request], Any]


def answer(text: str = "Paris.", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-remote",
        "object": "chat.completion",
        "created": 0,
        "model": "SmolLM2",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": {"content": [{"token": text, "logprob": -0.05, "top_logprobs": []}]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140},
        **extra,
    }


def settings(**values: Any) -> config.BackendSettings:
    base: dict[str, Any] = {"name": "gpu", "api_base": "http://gpu.test/v1"}
    return config.BackendSettings(**{**base, **values})


@contextlib.asynccontextmanager
async def started(
    settings: config.BackendSettings, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[RemoteBackend]:
    """A started RemoteBackend on ``settings`` (its network ``transport``, if one is given),
    once its first probe has answered or failed; closed afterwards."""
    backend = RemoteBackend(
        settings, timeout_s=30.0, default_max_tokens=512, prior=lambda: PRIOR, transport=transport
    )
    await backend.start()
    try:
        for _ in range(400):
            if backend.state != "probing":
                break
            await asyncio.sleep(0.01)
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def remote(handler: Handler, **values: Any) -> AsyncIterator[RemoteBackend]:
    """A started RemoteBackend whose network is ``handler``; waits for its first probe."""
    async with started(settings(**values), httpx.MockTransport(handler)) as backend:
        yield backend


def models_or(chat: Handler) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        result = chat(request)
        if asyncio.iscoroutine(result):
            result = await result
        assert isinstance(result, httpx.Response)
        return result

    return handler


# -- a remote backend on its own ------------------------------------------------------------------


async def test_rates_come_from_llama_server_timings_and_the_answer_is_scored() -> None:
    sent: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        timings = {
            "prompt_n": 100,
            "prompt_ms": 200.0,
            "prompt_per_second": 500.0,
            "predicted_n": 20,
            "predicted_ms": 400.0,
            "predicted_per_second": 50.0,
            "cache_n": 20,
        }
        return httpx.Response(200, json=answer(timings=timings))

    async with remote(models_or(chat)) as backend:
        assert backend.state == "up"
        completion = await backend.chat(
            {**REQUEST, "stream": True, "stream_options": {"include_usage": True}},
            deadline=time.monotonic() + 10,
        )
    assert sent[0]["model"] == "local" and sent[0]["logprobs"] is True
    assert "stream" not in sent[0] and "stream_options" not in sent[0]
    rates = backend.rates
    assert (rates.prefill_tok_s, rates.decode_tok_s, rates.source) == (500.0, 50.0, "timings")
    info = completion["frugal"]
    assert info["backend"] == "gpu" and info["stop_cause"] == "eos"
    assert info["cached_tokens"] == 20 and info["prefilled_tokens"] == 100
    assert 0.0 <= info["quality"]["value"] <= 1.0
    assert "timings" not in completion


async def test_without_timings_the_answers_wall_time_sets_the_rates() -> None:
    async def chat(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.2)
        return httpx.Response(200, json=answer())

    async with remote(models_or(chat), prefill_tok_s=1000.0, decode_tok_s=100.0) as backend:
        assert backend.rates.source == "config"
        await backend.chat(REQUEST, deadline=time.monotonic() + 10)
        rates = backend.rates
    # 120 prompt tokens at 10x the decode rate + 20 answer tokens (32 answer tokens' worth)
    # took a little over 0.2 s: under 160 tok/s, faster than the configured 100, moving there.
    assert rates.source == "requests"
    assert rates.decode_tok_s is not None and 100 < rates.decode_tok_s < 160
    assert rates.prefill_tok_s == pytest.approx(rates.decode_tok_s * 10)


async def test_until_it_has_answered_a_remote_assumes_the_engines_rates() -> None:
    async with remote(models_or(lambda r: httpx.Response(200, json=answer()))) as backend:
        rates = backend.rates
        assert (rates.prefill_tok_s, rates.decode_tok_s, rates.source) == (100.0, 10.0, "assumed")
        prediction = backend.predict(REQUEST, 8)
        assert prediction.seconds is not None and prediction.seconds > 0.8


async def test_a_server_that_refuses_logprobs_is_asked_again_without() -> None:
    sent: list[dict[str, Any]] = []

    def chat(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body.get("logprobs"):
            return httpx.Response(400, json={"error": {"message": "logprobs not supported"}})
        return httpx.Response(200, json=answer())

    async with remote(models_or(chat)) as backend:
        completion = await backend.chat(REQUEST, deadline=time.monotonic() + 10)
        await backend.chat(REQUEST, deadline=time.monotonic() + 10)
    assert completion["choices"][0]["message"]["content"] == "Paris."
    assert [b.get("logprobs") for b in sent] == [True, None, None]
    assert backend.logprobs is False


async def test_a_refused_connection_marks_the_backend_down_at_once() -> None:
    def chat(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with remote(models_or(chat)) as backend:
        with pytest.raises(BackendDown):
            await backend.chat(REQUEST, deadline=time.monotonic() + 10)
        assert backend.state == "down" and backend.stats.downs == 1
        assert not backend.admits(REQUEST, "chat")
        # The probe still answers, so it comes back.
        for _ in range(300):
            if backend.state == "up":
                break
            await asyncio.sleep(0.01)
        assert backend.state == "up"


async def test_a_backend_that_never_answers_a_probe_is_never_used() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    async with remote(hang, probe_timeout_s=0.1) as backend:
        assert backend.state == "down"
        assert not backend.admits(REQUEST, "chat")
        with pytest.raises(BackendDown):
            await backend.chat(REQUEST, deadline=time.monotonic() + 10)


async def test_going_down_fails_the_running_call_and_the_queue_behind_it() -> None:
    release = asyncio.Event()
    probes_fail = False

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            if probes_fail:
                await asyncio.sleep(60)
            return httpx.Response(200, json={"data": []})
        await release.wait()
        return httpx.Response(200, json=answer())

    async with remote(handler, max_concurrency=1, probe_timeout_s=0.1) as backend:
        deadline = time.monotonic() + 30
        first = asyncio.create_task(backend.chat(REQUEST, deadline=deadline))
        second = asyncio.create_task(backend.chat(REQUEST, deadline=deadline))
        for _ in range(200):
            if backend.health()["queue_depth"] == 1:
                break
            await asyncio.sleep(0.01)
        assert backend.health()["queue_depth"] == 1 and backend.health()["running"] == 1
        probes_fail = True
        backend.mark_down("test")
        for task in (first, second):
            with pytest.raises(BackendDown):
                await task
        assert backend.health()["queue_depth"] == 0
        assert backend.pending_work().jobs == 0


async def test_a_call_past_its_deadline_ends_at_the_deadline_and_checks_the_backend() -> None:
    probes_fail = False

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models") and not probes_fail:
            return httpx.Response(200, json={"data": []})
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    async with remote(handler, probe_timeout_s=0.1) as backend:
        probes_fail = True
        started = time.monotonic()
        with pytest.raises(EngineTimeout):
            await backend.chat(REQUEST, deadline=started + 0.3)
        assert time.monotonic() - started < 0.3 + 0.2  # the deadline, not the server, ended it
        for _ in range(200):
            if backend.state == "down":
                break
            await asyncio.sleep(0.01)
        assert backend.state == "down"


async def stubborn_chat(request: httpx.Request) -> httpx.Response:
    """A chat call that does not stop when it is cancelled: it goes on for 30 s, as a transport
    stuck in a blocking read would."""
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"data": []})
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(30)
    raise AssertionError("unreachable")


async def test_a_call_that_ignores_its_cancellation_still_ends_at_the_deadline() -> None:
    async with remote(stubborn_chat) as backend:
        started = time.monotonic()
        with pytest.raises(EngineTimeout):
            await asyncio.wait_for(backend.chat(REQUEST, deadline=started + 0.3), timeout=15)
        # the deadline and the bounded clean-up ended it, not the 30 s of the stuck call
        assert time.monotonic() - started < 15


async def test_the_callers_cancellation_is_not_swallowed() -> None:
    async with remote(stubborn_chat) as backend:
        task = asyncio.create_task(backend.chat(REQUEST, deadline=time.monotonic() + 60))
        for _ in range(200):
            if backend.health()["running"] == 1:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=15)
        assert task in done, "the request went on after its caller was cancelled"
        assert task.cancelled()


async def test_a_probe_stuck_behind_the_model_lock_does_not_outlive_its_call() -> None:
    # llama_cpp.server answers one request at a time, health probes included: a probe sent
    # during a call waits for the call, and its answer comes at the same moment as the call's.
    model_lock = asyncio.Lock()
    probes: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            probes.append(time.monotonic())  # when it was sent, not when it could be answered
        async with model_lock:
            if request.url.path.endswith("/models"):
                return httpx.Response(200, json={"data": []})
            await asyncio.sleep(4.0)  # past the watch's first wait (2.9 s for this answer)
            return httpx.Response(200, json=answer())

    async with remote(handler, probe_timeout_s=5.0) as backend:
        before = len(probes)
        completion = await asyncio.wait_for(
            backend.chat(REQUEST, deadline=time.monotonic() + 30), timeout=20
        )
        assert completion["choices"][0]["message"]["content"] == "Paris."
        finished = time.monotonic()
        assert len(probes) > before, "the watch never probed during the call"
        await asyncio.sleep(7)  # the old watch probed again 5.8 s after the call
        assert [t for t in probes if t > finished + 0.1] == []
        assert backend.state == "up"


async def test_a_watch_whose_cancellation_was_lost_ends_with_its_call() -> None:
    # On Python 3.11, wait_for inside the probe can drop the cancellation that _call sends when
    # the answer comes: the watch must then see for itself that its call is over.
    probes: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        probes.append(time.monotonic())
        return httpx.Response(200, json={"data": []})

    async with remote(handler) as backend:
        before = len(probes)
        call = asyncio.create_task(asyncio.sleep(2.5))  # done between the watch's probes
        watch = asyncio.create_task(backend._watch(0.0, call))  # never cancelled
        done, _ = await asyncio.wait({watch}, timeout=15)
        assert watch in done, "the watch went on probing after its call was over"
        assert len(probes) == before + 1  # once at 2 s, while the call ran; not after it
        assert backend.state == "up"


# -- the pool -------------------------------------------------------------------------------------


class StubBackend(Backend):
    """A backend with a fixed prediction, that answers or fails as told."""

    def __init__(self, name: str, seconds: float | None, fail: BaseException | None = None):
        self.name = name
        self.kind = "stub"
        self.timeout_s = 10.0
        self.seconds = seconds
        self.fail = fail
        self.calls = 0

    def ready(self) -> bool:
        return True

    def admits(self, request: dict[str, Any], kind: str) -> bool:
        return True

    def predict(self, request: dict[str, Any], completion_tokens: float) -> Prediction:
        return Prediction(
            backend=self.name,
            seconds=self.seconds,
            wait_s=0.0,
            own_s=self.seconds or 0.0,
            prompt_tokens=10,
            completion_tokens=completion_tokens,
            jobs_ahead=0,
            rates_source="stub",
        )

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return {"choices": [], "frugal": {"backend": self.name}}

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "state": "up"}


def pool(*backends: Backend) -> BackendPool:
    return BackendPool(list(backends), AnswerLengths(), default_max_tokens=512)


def test_the_pool_picks_the_lowest_predicted_finish() -> None:
    slow, fast, unknown = (
        StubBackend("engine", 5.0),
        StubBackend("gpu", 1.0),
        StubBackend("x", None),
    )
    choice = pool(slow, fast, unknown).choose(REQUEST)
    assert choice.backend is fast and choice.prediction.seconds == 1.0
    assert choice.prediction.completion_tokens == 8  # max_tokens, nothing learned yet


async def test_a_request_moves_to_the_next_backend_when_its_own_is_down() -> None:
    dead = StubBackend("gpu", 1.0, fail=BackendDown("gone"))
    engine = StubBackend("engine", 2.0)
    p = pool(engine, dead)
    choice = p.choose(REQUEST)
    assert choice.backend is dead
    completion, ran = await p.run(REQUEST, choice, deadline=time.monotonic() + 10)
    assert ran.backend is engine and completion["frugal"]["backend"] == "engine"
    assert p.moves == 1


async def test_a_request_is_not_moved_where_it_cannot_make_its_deadline() -> None:
    dead = StubBackend("gpu", 1.0, fail=BackendDown("gone"))
    engine = StubBackend("engine", 20.0)
    p = pool(engine, dead)
    with pytest.raises(BackendDown):
        await p.run(REQUEST, p.choose(REQUEST), deadline=time.monotonic() + 10)
    assert engine.calls == 0


# -- in the app -----------------------------------------------------------------------------------


def fast_backend(api: FakeAPI, **values: Any) -> dict[str, Any]:
    """A [[local.backends]] entry whose assumed rates make it everyone's first choice."""
    return {
        "name": "peer",
        "api_base": api.url,
        "prefill_tok_s": 1e6,
        "decode_tok_s": 1e6,
        "probe_timeout_s": 0.5,
        **values,
    }


async def wait_for_state(client: httpx.AsyncClient, name: str, state: str) -> dict[str, Any]:
    for _ in range(400):
        backends = (await client.get("/healthz")).json()["routing"]["backends"]
        health: dict[str, Any] = next(b for b in backends if b["name"] == name)
        if health["state"] == state:
            return health
        await asyncio.sleep(0.05)
    raise AssertionError(f"backend {name} never became {state}: {health}")


async def test_a_dead_backend_at_start_leaves_requests_to_the_engine(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    dead = {"name": "peer", "api_base": "http://127.0.0.1:9/v1", "probe_timeout_s": 0.5}
    s = settings_for(tmp_path, fake_api, local={"backends": [dead]})
    async with make_client(s) as client:
        health = await wait_for_state(client, "peer", "down")
        assert health["error"].startswith("health probe")
        response = await client.post("/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY)
        assert response.headers["x-frugal-route"] == "local"
        metrics = (await client.get("/metrics")).text
    assert 'frugal_backend_up{backend="peer"} 0.0' in metrics
    conn = sqlite3.connect(tmp_path / "ledger.db")
    assert conn.execute("SELECT backend FROM requests").fetchall() == [("engine",)]
    conn.close()


async def test_a_backend_that_stops_answering_hands_its_requests_on_before_their_deadline(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    timeout_s = 20.0
    with FakeAPI() as peer:
        entry = fast_backend(peer, timeout_s=timeout_s, max_concurrency=1)
        s = settings_for(tmp_path, fake_api, local={"backends": [entry]})
        async with make_client(s) as client:
            await wait_for_state(client, "peer", "up")
            first = await client.post("/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY)
            assert first.headers["x-frugal-route"] == "local"
            assert first.headers["x-frugal-quality"] != "none"  # scored like the engine's
            assert peer.count >= 2 and peer.requests[-1].body["model"] == "local"

            peer.set(hang=True)

            async def timed() -> tuple[float, httpx.Response]:
                started = time.monotonic()
                response = await client.post(
                    "/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY
                )
                return time.monotonic() - started, response

            results = await asyncio.gather(timed(), timed())  # one runs, one waits behind it
            health = await wait_for_state(client, "peer", "down")
            assert health["downs"] == 1
            for elapsed, response in results:
                assert response.status_code == 200
                assert elapsed < timeout_s  # handed on, not left to wait out the deadline
            peer.set(hang=False)
            await wait_for_state(client, "peer", "up")
    conn = sqlite3.connect(tmp_path / "ledger.db")
    backends = [row[0] for row in conn.execute("SELECT backend FROM requests ORDER BY id")]
    conn.close()
    assert backends == ["peer", "engine", "engine"]


def test_backend_settings_are_checked() -> None:
    ok = settings_for(Path("/tmp"), local={"backends": [{"name": "a", "api_base": "http://a"}]})
    assert ok.local.backends[0].model == "local" and ok.local.backends[0].max_concurrency == 1
    for entry, needle in (
        ({"api_base": "http://a"}, "name: missing"),
        ({"name": "engine", "api_base": "http://a"}, 'name = "engine"'),
        ({"name": "a", "api_base": "ftp://a"}, "expected an http(s) URL"),
        ({"name": "a", "api_base": "http://a", "max_concurrency": 0}, "max_concurrency = 0"),
        ({"name": "a", "api_base": "http://a", "colour": "red"}, "colour: unknown key"),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            settings_for(Path("/tmp"), local={"backends": [entry]})
    twice = [{"name": "a", "api_base": "http://a"}, {"name": "a", "api_base": "http://b"}]
    with pytest.raises(ConfigError, match="unique name"):
        settings_for(Path("/tmp"), local={"backends": twice})


@pytest.mark.serve
async def test_a_second_frugal_serve_is_a_local_backend(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any], engine: LocalEngine
) -> None:
    from tests.server.test_serve import start_server, stop_server

    peer_dir = tmp_path / "peer"
    peer_dir.mkdir()
    peer = await asyncio.to_thread(start_server, peer_dir, fake_api)
    try:
        entry = {**fast_backend(fake_api), "api_base": peer.base + "/v1", "kind": "frugal"}
        s = settings_for(tmp_path, fake_api, local={"backends": [entry]})
        async with make_client(s) as client:
            await wait_for_state(client, "peer", "up")
            response = await client.post("/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY)
            assert response.headers["x-frugal-route"] == "local"
            assert response.headers["x-frugal-quality"] != "none"
            assert response.json()["choices"][0]["message"]["content"]
            health = await wait_for_state(client, "peer", "up")
            assert health["completed"] == 1 and health["rates_source"] == "requests"
            # kind "frugal" takes n up to 8: the peer's engine answers both choices
            two = await client.post(
                "/v1/chat/completions", json={**REQUEST, "n": 2}, headers=ACCEPT_ANY
            )
            assert two.headers["x-frugal-route"] == "local"
            assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    finally:
        assert await asyncio.to_thread(stop_server, peer) == 0
    conn = sqlite3.connect(tmp_path / "ledger.db")
    assert conn.execute("SELECT backend, route FROM requests").fetchall() == [
        ("peer", "local"),
        ("peer", "local"),
    ]
    conn.close()
    peer_ledger = sqlite3.connect(peer.db)
    # The peer answered them as its own model "local": locally, never through its API.
    assert peer_ledger.execute("SELECT requested_model, route FROM requests").fetchall() == [
        ("local", "local"),
        ("local", "local"),
    ]
    peer_ledger.close()


# -- the answer's size bound ([[local.backends]] max_answer_bytes) ---------------------------------

MIB = 1024 * 1024


@pytest.mark.parametrize("live", [False, True], ids=["json", "stream"])
async def test_an_answer_past_max_answer_bytes_fails_the_call_and_leaves_the_backend_up(
    live: bool,
) -> None:
    """A server that answers 8 MiB (a JSON body, or a stream whose one event is one 8 MiB
    line) against a bound of 1 MiB: the call fails as a backend failure the router sends to the
    API, before any token is out, and the backend stays up for the next request."""
    tokens: list[str] = []
    with FakeAPI(huge_reply_bytes=8 * MIB) as peer:
        entry = settings(api_base=peer.url, logprobs=False, max_answer_bytes=MIB)
        async with started(entry) as backend:
            assert backend.state == "up", backend.error
            ask = Ask(deadline=time.monotonic() + 30, on_token=tokens.append if live else None)
            with pytest.raises(EngineCrashed, match="too large: more than 1048576 bytes") as got:
                await backend.answer(REQUEST, ask)
            state, failures = backend.state, backend.stats.failures
        print(f"the server sent {peer.huge_sent / MIB:.1f} MiB of 8 before it was left")
    assert type(got.value) is EngineCrashed  # not BackendDown: the request goes to the API
    assert tokens == []
    assert (state, failures) == ("up", 1)


async def test_an_answer_under_max_answer_bytes_is_read_parsed_and_scored() -> None:
    size = 600 * 1024  # over PARSE_IN_THREAD_BYTES: parsed in a thread
    with FakeAPI(huge_reply_bytes=size) as peer:
        entry = settings(api_base=peer.url, logprobs=False, max_answer_bytes=MIB)
        async with started(entry) as backend:
            completion = await backend.answer(REQUEST, Ask(deadline=time.monotonic() + 60))
    assert completion["choices"][0]["message"]["content"] == "a" * size
    assert completion["frugal"]["quality"]["value"] is not None


class _SlowGate:
    """A gate whose scoring takes as long as the test says (it waits for ``done``), as scoring a
    few MB of answer takes seconds: whether the call waits for it does not hang on this
    machine's speed."""

    def __init__(self, gate: Any) -> None:
        self.gate = gate
        self.done = threading.Event()
        self.started = threading.Event()

    def score_answer(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        self.done.wait(30)
        return self.gate.score_answer(*args, **kwargs)


async def test_a_big_answer_under_the_bound_is_scored_off_the_loop_and_by_the_deadline() -> None:
    """4 MiB of text (under the default 8 MiB bound) is read, parsed and scored in a thread:
    a score not done by the request's deadline ends the call there with EngineTimeout, not
    when the score is done, and the loop keeps turning meanwhile (its longest pause is
    printed)."""
    size, budget_s = 4 * MIB, 1.5
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    with FakeAPI(huge_reply_bytes=size) as peer:
        async with started(settings(api_base=peer.url, logprobs=False)) as backend:
            slow = _SlowGate(backend.gate)
            backend.gate = slow
            ticking = asyncio.create_task(ticker())
            started_at = time.perf_counter()
            try:
                with pytest.raises(EngineTimeout, match="not scored before the deadline"):
                    await backend.answer(REQUEST, Ask(deadline=time.monotonic() + budget_s))
                elapsed = time.perf_counter() - started_at
            finally:
                slow.done.set()  # the scoring thread ends on its own, as after a real deadline
                ticking.cancel()
            state = backend.state
    print(
        f"ended after {elapsed:.2f} s (deadline {budget_s} s); longest loop pause {max(gaps):.3f} s"
    )
    assert slow.started.is_set()  # the whole answer was read and handed to the gate
    assert elapsed < budget_s + 5  # the call did not wait for the score
    assert state == "up"


# -- issue 39: a backend that echoes its key ------------------------------------------------------

BACKEND_KEY = "sk-backend+i39/key=0123456789abcdef"


def _echo(request: httpx.Request) -> str:
    sent = request.headers.get("authorization", "")
    return f"you sent {sent!r}, key {sent[7:]}"


async def test_a_backends_refusal_or_error_event_is_told_without_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("I39_BACKEND", BACKEND_KEY)

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": _echo(request)}})

    def stream_then_fail(request: httpx.Request) -> httpx.Response:
        chunk = {"choices": [{"index": 0, "delta": {"content": "Paris"}, "finish_reason": None}]}
        events = [f"data: {json.dumps(chunk)}", f"data: {json.dumps({'error': _echo(request)})}"]
        return httpx.Response(200, text="\n\n".join(events) + "\n\n")

    told = []
    for handler, live in ((refuse, False), (stream_then_fail, True)):
        async with remote(models_or(handler), api_key_env="I39_BACKEND") as backend:
            with pytest.raises(EngineCrashed) as caught:
                await backend.chat(
                    {**REQUEST, "stream": live},
                    deadline=time.monotonic() + 10,
                    on_token=(lambda piece: None) if live else None,
                )
        told.append(str(caught.value))
    print(told)
    assert all("0123456789abcdef" not in text and MARK in text for text in told), told
