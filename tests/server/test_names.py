"""Names a client can rely on (issue 42): a local answer's ``model`` is the model the client
asked for, as Ollama's and llama-server's aliases answer, and the local model that really
answered is the ``x-frugal-local-model`` header and the ledger's ``local_model``;
``GET /v1/models`` lists ``local``, the models the config names and the upstream's own list,
read once in a while and bounded (:mod:`proxy.upstream.model_list`).

The real SmolLM2 answers locally, in-process; the fake API is the upstream."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.upstream import model_list
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows, sse_events

LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
ASKED = "gpt-4o-mini"
QUESTION = "What is the capital of France?"
LIMIT = 8  # max_tokens: a short local answer


def _engine_model(http: Any) -> str:
    """The local model's own name: the GGUF file the engine loaded."""
    name = http.app.state.services.engine.health()["model"]
    assert isinstance(name, str) and name.endswith(".gguf"), name
    return name


def _models_in(path: str, body: dict[str, Any], stream: bool, text: str) -> list[str]:
    """Every ``model`` an answer (JSON, or each event of its stream) names."""
    if not stream:
        answer = json.loads(text)
        return [answer["response"]["model"] if "response" in answer else answer["model"]]
    found = []
    for data in sse_events(text):
        if data == "[DONE]":
            continue
        event = json.loads(data)
        holder = event.get("response", event)  # a Responses event carries the response
        if "model" in holder:
            found.append(holder["model"])
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}),
        ("/v1/completions", {"prompt": QUESTION}),
        ("/v1/responses", {"input": QUESTION}),
    ],
    ids=["chat", "completions", "responses"],
)
async def test_a_local_answer_names_the_model_asked_for_and_the_header_the_local_one(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    path: str,
    body: dict[str, Any],
    stream: bool,
) -> None:
    limit = {"max_output_tokens": 16} if path == "/v1/responses" else {"max_tokens": LIMIT}
    asked = {"model": ASKED, **body, **limit, "stream": stream}
    async with make_client(settings_for(tmp_path, fake_api)) as http:
        local = _engine_model(http)
        r = await http.post(path, json=asked, headers=LOCAL)
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == "local"
    named = _models_in(path, body, stream, r.text)
    print(path, "stream" if stream else "json", "answer names", set(named), "local", local)
    assert named and set(named) == {ASKED}
    assert r.headers["x-frugal-local-model"] == local
    [row] = rows(tmp_path / "ledger.db")
    assert (row["route"], row["requested_model"], row["local_model"]) == ("local", ASKED, local)
    assert fake_api.count == 0


async def test_the_live_stream_names_the_model_asked_for(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``stream_mode = "live"``: the chunks go out before the answer is done, each with the
    asked name; the ledger names the local model."""
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    body = {"model": ASKED, "messages": [{"role": "user", "content": QUESTION}], "stream": True}
    async with make_client(settings) as http:
        local = _engine_model(http)
        r = await http.post("/v1/chat/completions", json={**body, "max_tokens": LIMIT})
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-reason"] == "live"
    named = {json.loads(d)["model"] for d in sse_events(r.text) if d != "[DONE]"}
    assert named == {ASKED}
    [row] = rows(tmp_path / "ledger.db")
    assert row["local_model"] == local


async def test_the_api_route_names_no_local_model_and_passes_the_apis_name(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {"model": ASKED, "messages": [{"role": "user", "content": QUESTION}]}
    async with make_client(settings_for(tmp_path, fake_api)) as http:
        r = await http.post("/v1/chat/completions", json=body, headers={"x-frugal-route": "api"})
    assert r.status_code == 200, r.text
    assert "x-frugal-local-model" not in r.headers
    [row] = rows(tmp_path / "ledger.db")
    assert (row["route"], row["local_model"]) == ("api", None)


# -- GET /v1/models --------------------------------------------------------------------------

CONFIGURED: dict[str, Any] = {
    "fallback": {"models": {"my-alias": "gpt-4o"}},
    "quality": {"models": {"gpt-4.1-nano": 0.7, ASKED: 0.6}},
    "pricing": {"house-model": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}},
}


def _ids(answer: Any) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [m["id"] for m in answer.json()["data"]]


def _model_reads(api: FakeAPI) -> int:
    return sum(1 for r in api.requests if r[0] == "/v1/models")


async def test_models_lists_local_the_configured_models_and_the_upstreams_once(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(models=(ASKED, "gpt-4o", "o3", "gpt-4.1-nano"))
    async with make_client(settings_for(tmp_path, fake_api, **CONFIGURED)) as http:
        first = _ids(await http.get("/v1/models"))
        again = _ids(await http.get("/models"))
    # each name once: local, the config's (mappings, thresholds, pricing), then the upstream's
    assert first == ["local", "my-alias", "gpt-4.1-nano", ASKED, "house-model", "gpt-4o", "o3"]
    assert again == first
    assert _model_reads(fake_api) == 1  # the second list came from the cache


async def test_models_without_a_readable_upstream_lists_the_proxys_own_names(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(fail_status=500)
    async with make_client(settings_for(tmp_path, fake_api, **CONFIGURED)) as http:
        first = _ids(await http.get("/v1/models"))
        again = _ids(await http.get("/v1/models"))
    assert first == again == ["local", "my-alias", "gpt-4.1-nano", ASKED, "house-model"]
    assert _model_reads(fake_api) == 1  # a failed read is remembered too, not asked per call


async def test_models_from_a_huge_upstream_list_keeps_the_first_ids(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    listed = tuple(f"model-{i}" for i in range(3 * model_list.MAX_IDS))
    fake_api.set(models=listed)
    async with make_client(settings_for(tmp_path, fake_api)) as http:
        ids = _ids(await http.get("/v1/models"))
    assert ids == ["local", *listed[: model_list.MAX_IDS]]


async def test_models_from_an_upstream_that_never_answers_is_bounded_in_time(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(hang=True)
    async with make_client(settings_for(tmp_path, fake_api, **CONFIGURED)) as http:
        started = time.monotonic()
        ids = _ids(await http.get("/v1/models"))
        took = time.monotonic() - started
    print(f"/v1/models with a hung upstream answered in {took:.2f} s (bound {model_list.READ_S})")
    assert ids == ["local", "my-alias", "gpt-4.1-nano", ASKED, "house-model"]
    assert _model_reads(fake_api) == 1


def test_a_listed_body_keeps_string_ids_once_and_refuses_other_shapes() -> None:
    long = "x" * (model_list.MAX_ID_CHARS + 1)
    data = {"data": [{"id": "a"}, {"id": 7}, "b", {"id": "a"}, {"id": long}, {"id": "c"}, {}]}
    assert model_list.listed_ids(data) == ["a", "c"]
    for bad in ([], {"data": {}}, {"object": "list"}, "x"):
        with pytest.raises(ValueError):
            model_list.listed_ids(bad)
