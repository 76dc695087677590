"""The load remote servers publish (``proxy.routing.remote_load``), the predictions made from
it, and the health checks per kind (``proxy.routing.remote_health``).

The servers are stand-ins on loopback (``tests/stand_in_servers.py``) that publish their load as
llama-server, vLLM and Ollama do; "another client" is played by setting their counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy import config
from proxy.routing.base import BackendDown
from proxy.routing.remote import RemoteBackend
from proxy.routing.remote_load import BadLoad, Load, LoadWatch, parse_prometheus
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.routing.test_backends import StubBackend, pool, started, wait_for_state
from tests.stand_in_servers import StandIn

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
REQUEST = {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 8}
ACCEPT_ANY = {"x-frugal-min-quality": "0"}


@contextlib.asynccontextmanager
async def remote(server: StandIn, **values: Any) -> AsyncIterator[RemoteBackend]:
    """A started RemoteBackend on ``server``, once its first probe has answered or failed."""
    base: dict[str, Any] = {
        "name": "gpu",
        "api_base": server.url,
        "kind": server.kind,
        "prefill_tok_s": 1000.0,
        "decode_tok_s": 100.0,
    }
    async with started(config.BackendSettings(**{**base, **values})) as backend:
        yield backend


async def reading(backend: RemoteBackend, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Use the backend (a prediction) until its published load satisfies ``done``."""
    assert backend.load is not None
    for _ in range(750):
        backend.predict(REQUEST, 8)
        health = backend.load.health()
        if health is not None and done(health):
            return health
        await asyncio.sleep(0.02)
    raise AssertionError(f"no such reading: {backend.load.health()}")


# -- reading what each kind publishes --------------------------------------------------------------


def test_prometheus_samples_are_added_up_over_their_labels() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a b"} 2.0\n'
        'vllm:num_requests_running{model_name="c"} 1.0 1712345678\n'
        "vllm:num_requests_waiting 5\n"
        "vllm:num_requests_running_total 99\n"
    )
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    assert parse_prometheus(text, names) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 5.0,
    }
    for bad in (
        "vllm:num_requests_waiting NaN",
        "vllm:num_requests_waiting -1",
        "vllm:x 1\nvllm:num_requests_waiting many",
    ):
        with pytest.raises(BadLoad):
            parse_prometheus(bad, names)


async def test_llama_server_load_comes_from_metrics_and_slots() -> None:
    with StandIn("llama-server") as server:
        server.running, server.waiting, server.slots = 3, 5, 4
        async with remote(server) as backend:
            assert backend.state == "up"
            health = await reading(backend, lambda h: h.get("running") == 3)
    assert health["waiting"] == 5 and health["slots"] == 4
    assert health["foreign"] == 8 and health["ours"] == 0
    assert health["source"] == "/metrics /slots" and health["used"] is True
    assert "/health" in server.paths  # the kind's probe


async def test_llama_server_without_metrics_is_read_from_its_slots() -> None:
    with StandIn("llama-server") as server:
        server.running, server.slots = 2, 2
        server.metrics = "# llama-server started without --metrics\n"
        async with remote(server) as backend:
            health = await reading(backend, lambda h: h.get("running") == 2)
    assert health["waiting"] is None and health["slots"] == 2 and health["foreign"] == 2
    assert health["source"] == "/slots" and "no llamacpp:requests_processing" in health["error"]


async def test_vllm_load_comes_from_its_metrics() -> None:
    with StandIn("vllm") as server:
        server.running, server.waiting = 1, 4
        async with remote(server) as backend:
            health = await reading(backend, lambda h: h.get("waiting") == 4)
    assert (health["running"], health["foreign"], health["source"]) == (1, 5, "/metrics")


async def test_ollama_publishes_its_loaded_models_and_no_counts() -> None:
    with StandIn("ollama", model="llama3.1:8b") as server:
        async with remote(server, model="llama3.1:8b") as backend:
            assert backend.state == "up"
            idle = backend.predict(REQUEST, 8).seconds
            health = await reading(backend, lambda h: h.get("models") is not None)
            after = backend.predict(REQUEST, 8).seconds
    assert health["models"] == ["llama3.1:8b"] and health["source"] == "/api/ps"
    assert health["running"] is None and health["foreign"] is None and health["used"] is False
    assert after == idle  # no counts: predicted as without published load


async def test_bad_counters_leave_the_prediction_as_it_was() -> None:
    with StandIn("llama-server") as server:
        server.metrics = "llamacpp:requests_processing NaN\nllamacpp:requests_deferred 5\n"
        server.slots_page = "<html>not slots</html>"
        async with remote(server) as backend:
            idle = backend.predict(REQUEST, 8).seconds
            health = await reading(backend, lambda h: h.get("error") is not None)
            after = backend.predict(REQUEST, 8)
            assert backend.state == "up"
    assert "is not a count" in health["error"] and "/slots is not JSON" in health["error"]
    assert health["used"] is False and "running" not in health
    assert after.seconds == idle and after.jobs_ahead == 0


async def test_llama_cpp_python_is_never_asked_for_its_load() -> None:
    """Any request that reaches llama_cpp.server during a stream cuts the stream: only the
    kind's probe (/docs) and the chat request are ever sent there."""
    with StandIn("llama-server") as server:
        server.running, server.waiting = 3, 5
        async with remote(server, kind="llama-cpp-python") as backend:
            assert backend.load is None
            for _ in range(3):
                backend.predict(REQUEST, 8)
                await backend.chat(REQUEST, deadline=time.monotonic() + 10)
            await asyncio.sleep(0.1)
            assert backend.health()["published"] is None
    # the stand-in has no /docs (a 404 still answers the probe): only the answers were asked
    assert server.paths == ["/v1/chat/completions"] * 3


async def test_readings_are_made_after_each_answer_and_old_or_failed_ones_are_not_used() -> None:
    results: list[Any] = []

    async def read() -> tuple[Load | None, str | None]:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result, None

    async def readings(watch: LoadWatch, n: int) -> None:
        for _ in range(500):
            if watch.readings >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{watch.readings} readings, not {n}")

    now = time.monotonic()
    results += [
        Load(running=2, waiting=1, at=now),
        Load(running=2, waiting=1, at=now - 60),  # a reading that came back a minute late
        RuntimeError("no"),
    ]
    watch = LoadWatch("gpu", read, interval_s=3600)  # no reading but the ones asked for
    try:
        watch.used()
        await readings(watch, 1)
        assert watch.fresh() is not None and watch.fresh() == watch.last
        watch.answered()
        await readings(watch, 2)
        assert watch.last is not None and watch.fresh() is None  # stale: not used
        watch.answered()
        await readings(watch, 3)
        assert watch.last is None and watch.error == "RuntimeError"
        assert watch.health() == {"used": False, "error": "RuntimeError"}
    finally:
        await watch.close()


# -- the predictor sees other clients' requests ----------------------------------------------------


async def test_a_backend_loaded_by_another_client_sends_work_to_the_engine() -> None:
    engine = StubBackend("engine", 0.2)
    with StandIn("llama-server") as server:
        server.slots = 4
        async with remote(server) as backend:
            p = pool(engine, backend)
            await reading(backend, lambda h: h.get("running") == 0)
            idle = p.choose(REQUEST)
            assert idle.backend is backend  # about 0.09 s against the engine's 0.2 s
            assert idle.prediction.jobs_ahead == 0

            server.running, server.waiting = 3, 5  # another client's requests
            await reading(backend, lambda h: h.get("foreign") == 8)
            loaded = p.choose(REQUEST)
            assert loaded.backend is engine
            seen = backend.predict(REQUEST, 8)
            assert seen.jobs_ahead == 8 and seen.seconds is not None and seen.seconds > 0.2

            server.running, server.waiting = 0, 0  # the other client is gone
            await reading(backend, lambda h: h.get("foreign") == 0)
            assert p.choose(REQUEST).backend is backend


async def test_our_own_requests_are_not_counted_as_foreign() -> None:
    with StandIn("llama-server") as server:
        server.running = 1
        async with remote(server) as backend:
            backend._calls.add(asyncio.get_running_loop().create_future())  # type: ignore[arg-type]
            health = await reading(backend, lambda h: h.get("running") == 1)
            backend._calls.clear()
    assert health["ours"] == 1 and health["foreign"] == 0


# -- health per kind -------------------------------------------------------------------------------


async def test_a_vllm_server_without_the_model_is_down_with_the_reason() -> None:
    with StandIn("vllm", model="Qwen/Qwen2.5-7B") as server:
        async with remote(server, model="local") as backend:
            health = backend.health()
    assert health["state"] == "down"
    assert health["error"] == (
        "health probe: model 'local' is not in its model list (Qwen/Qwen2.5-7B)"
    )
    assert health["last_down"] == health["error"]


async def test_an_answer_from_another_model_marks_the_backend_down() -> None:
    with StandIn("vllm", model="qwen") as server:
        server.answer_model = "llama"
        async with remote(server, model="qwen") as backend:
            assert backend.state == "up"
            with pytest.raises(BackendDown, match="answered wrongly"):
                await backend.chat(REQUEST, deadline=time.monotonic() + 10)
            health = backend.health()
    assert health["state"] == "down" and health["downs"] == 1 and health["handed_on"] == 1
    assert health["error"] == "wrong answer: it answered as model 'llama', not 'qwen'"


async def test_an_answer_that_is_not_json_marks_the_backend_down() -> None:
    with StandIn("llama-server") as server:
        server.chat_body = "<html>502 Bad Gateway</html>"
        async with remote(server) as backend:
            with pytest.raises(BackendDown):
                await backend.chat(REQUEST, deadline=time.monotonic() + 10)
            health = backend.health()
            server.chat_body = None
            for _ in range(400):  # probed again after a pause, and used again
                if backend.state == "up":
                    break
                await asyncio.sleep(0.01)
            again = await backend.chat(REQUEST, deadline=time.monotonic() + 10)
    assert health["state"] == "down"
    assert health["error"] == "wrong answer: its answer is not a chat completion's JSON"
    assert again["choices"][0]["message"]["content"] == "Paris."
    assert backend.last_down == health["error"]


async def test_a_model_list_that_is_not_json_is_a_failed_probe() -> None:
    with StandIn("ollama", model="m") as server:
        server.app.routes.insert(0, _text_route("/v1/models", "<html>login</html>"))
        async with remote(server, model="m") as backend:
            health = backend.health()
    assert health["state"] == "down" and health["error"] == (
        "health probe: its model list is not JSON"
    )


def _text_route(path: str, text: str) -> Any:
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def page(request: Any) -> PlainTextResponse:
        return PlainTextResponse(text)

    return Route(path, page, methods=["GET"])


# -- in the app ------------------------------------------------------------------------------------


def peer(name: str, server: StandIn, **values: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": server.kind,
        "api_base": server.url,
        "prefill_tok_s": 1e5,
        "decode_tok_s": 1e4,
        "probe_timeout_s": 0.5,
        **values,
    }


async def published(client: Any, name: str, done: Callable[[dict[str, Any]], bool]) -> None:
    """Ask for predictions (requests to the models list do not predict; a forced-API request
    does not either), until the backend's published load satisfies ``done``."""
    app = client.app
    for _ in range(750):
        backend = next(b for b in app.state.services.router.pool.backends if b.name == name)
        backend.predict(REQUEST, 8)
        health = backend.health()["published"]
        if health is not None and done(health):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"backend {name} never published that")


async def test_the_loaded_of_two_servers_is_passed_over_and_metrics_show_why(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    """Two stand-ins predicted alike, both far faster than the engine: without its published
    load the first (busy) would win the tie; with it, the idle one answers."""
    with StandIn("llama-server") as busy_server, StandIn("vllm") as idle_server:
        busy_server.running, busy_server.waiting = 3, 5
        entries = [peer("busy", busy_server), peer("idle", idle_server)]
        s = settings_for(tmp_path, fake_api, local={"backends": entries})
        async with make_client(s) as client:
            await wait_for_state(client, "busy", "up")
            await wait_for_state(client, "idle", "up")
            await published(client, "busy", lambda h: h.get("foreign") == 8)
            await published(client, "idle", lambda h: h.get("foreign") == 0)
            response = await client.post("/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY)
            assert response.status_code == 200
            assert response.headers["x-frugal-route"] == "local"
            assert response.headers["x-frugal-reason"] == "accepted"
            health = (await client.get("/healthz")).json()["routing"]["backends"]
            metrics = (await client.get("/metrics")).text
    by_name = {b["name"]: b for b in health}
    assert by_name["busy"]["published"]["running"] == 3
    assert by_name["busy"]["published"]["waiting"] == 5
    assert by_name["busy"]["completed"] == 0 and by_name["idle"]["completed"] == 1
    assert by_name["idle"]["finish"]["count"] == 1
    assert by_name["idle"]["finish"]["last_actual_s"] > 0
    assert 'frugal_backend_published_requests{backend="busy",state="running"} 3.0' in metrics
    assert 'frugal_backend_published_requests{backend="busy",state="waiting"} 5.0' in metrics
    assert 'frugal_backend_foreign_requests{backend="busy"} 8.0' in metrics
    assert 'frugal_backend_finish_seconds_count{backend="idle",measure="predicted"} 1.0' in metrics
    assert 'frugal_backend_finish_seconds_count{backend="idle",measure="actual"} 1.0' in metrics
    conn = sqlite3.connect(tmp_path / "ledger.db")
    assert conn.execute("SELECT backend, route FROM requests").fetchall() == [("idle", "local")]
    conn.close()


async def test_a_loaded_server_sends_its_work_to_the_engine_or_the_api(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    """One stand-in, loaded by another client: it would answer in about 0.09 s, but with 8
    requests ahead of this one it is predicted past its own 0.15 s deadline. The request goes
    to the engine when the engine is predicted faster, else to the API as ``predicted_slow``;
    never to the loaded server."""
    with StandIn("llama-server") as server:
        server.running, server.waiting, server.slots = 3, 5, 4
        entry = peer("busy", server, prefill_tok_s=1000.0, decode_tok_s=100.0, timeout_s=0.15)
        s = settings_for(tmp_path, fake_api, local={"backends": [entry]})
        async with make_client(s) as client:
            await wait_for_state(client, "busy", "up")
            await published(client, "busy", lambda h: h.get("foreign") == 8)
            backend = next(
                b for b in client.app.state.services.router.pool.backends if b.name == "busy"
            )
            assert backend.predict(REQUEST, 8).seconds > 0.15
            response = await client.post("/v1/chat/completions", json=REQUEST, headers=ACCEPT_ANY)
            assert response.status_code == 200
            route = (response.headers["x-frugal-route"], response.headers["x-frugal-reason"])
    assert route in (("local", "accepted"), ("api", "predicted_slow"))
    conn = sqlite3.connect(tmp_path / "ledger.db")
    (backend_name,) = conn.execute("SELECT backend FROM requests").fetchone()
    conn.close()
    assert backend_name in ("engine", "busy") and "/v1/chat/completions" not in server.paths
