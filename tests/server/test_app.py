"""The app in-process (httpx.ASGITransport), with the real engine and the fake API on loopback."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from structlog.testing import capture_logs

from proxy.engine.local_engine import LocalEngine
from proxy.errors import InternalError
from proxy.serving import events as sse
from tests.conftest import FAKE_KEY, settings_for
from tests.fake_api import FakeAPI
from tests.test_errors import assert_404_and_405

FACT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def rows(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY id")]
    finally:
        conn.close()


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def test_accepted_local_answer_has_routing_headers_and_a_ledger_row(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, quality={"threshold": 0.0})
    async with make_client(settings) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 16},
            headers={"x-request-id": "req-accepted-1"},
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == "local"
    assert r.headers["x-frugal-reason"] == "accepted"
    assert 0.0 <= float(r.headers["x-frugal-quality"]) <= 1.0
    assert r.headers["x-request-id"] == "req-accepted-1"
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"]
    assert "frugal" not in body
    assert body["choices"][0]["logprobs"] is None  # not asked for
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert row["request_id"] == "req-accepted-1"
    assert (row["route"], row["reason"], row["status"]) == ("local", "accepted", 200)
    assert row["requested_model"] == "gpt-4o-mini"
    assert row["quality"] == pytest.approx(float(r.headers["x-frugal-quality"]), abs=1e-3)
    assert row["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert row["completion_tokens"] == body["usage"]["completion_tokens"]
    assert row["api_cost_pusd"] == 0
    # The counterfactual counts the tokens gpt-4o-mini would have used (o200k, with OpenAI's
    # 3 tokens per message and 3 to prime the reply), not the local model's.
    o200k = tiktoken.get_encoding("o200k_base")
    prompt = 3 + len(o200k.encode("user")) + len(o200k.encode(FACT[0]["content"])) + 3
    answer = len(o200k.encode(body["choices"][0]["message"]["content"]))
    assert (row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"]) == (
        prompt,
        answer,
    )
    assert row["token_source"] == "tokenizer"
    assert row["counterfactual_prompt_tokens"] != row["local_prompt_tokens"]
    # gpt-4o-mini is in the price map: the counterfactual is priced, and exact.
    assert row["counterfactual_cost_pusd"] == prompt * 150_000 + answer * 600_000
    assert row["local_ms"] > 0 and row["latency_ms"] >= row["local_ms"]


async def test_answer_below_the_threshold_goes_to_the_api_with_the_requested_model(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(reply="Paris.")
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 16},
            headers={"x-frugal-min-quality": "1.0"},
        )
    assert r.status_code == 200, r.text
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("api", "low_quality")
    assert r.headers["x-frugal-quality"] != "none"
    assert r.json()["choices"][0]["message"]["content"] == "Paris."
    [(path, headers, sent)] = fake_api.requests
    assert path == "/v1/chat/completions"
    assert sent["model"] == "gpt-4o-mini"
    assert sent["messages"] == FACT
    assert headers["authorization"] == f"Bearer {FAKE_KEY}"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["route"], row["reason"]) == ("api", "low_quality")
    usage = r.json()["usage"]
    expected = usage["prompt_tokens"] * 150_000 + usage["completion_tokens"] * 600_000
    assert row["api_cost_pusd"] == expected
    assert row["counterfactual_cost_pusd"] == expected
    assert row["local_ms"] > 0  # the latency tax of the rejected attempt
    assert row["latency_tax_ms"] == row["local_ms"]
    assert (row["api_model"], row["token_source"]) == ("gpt-4o-mini", "usage")


async def test_quality_models_set_the_threshold_per_requested_model_and_the_header_wins(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(reply="Paris.")
    thresholds = {"strict-model": 1.0, "lenient-model": 0.0}
    settings = settings_for(tmp_path, fake_api, quality={"threshold": 0.6, "models": thresholds})
    chat = {"messages": FACT, "max_tokens": 16}
    async with make_client(settings) as client:
        lenient = await client.post("/v1/chat/completions", json={"model": "lenient-model", **chat})
        strict = await client.post("/v1/chat/completions", json={"model": "strict-model", **chat})
        header = await client.post(
            "/v1/chat/completions",
            json={"model": "strict-model", **chat},
            headers={"x-frugal-min-quality": "0"},
        )
        legacy = await client.post(
            "/v1/completions",
            json={"model": "strict-model", "prompt": "The capital of France is", "max_tokens": 8},
        )
        health = (await client.get("/healthz")).json()
    got = [(r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) for r in (lenient, strict)]
    assert got == [("local", "accepted"), ("api", "low_quality")]
    assert (header.headers["x-frugal-route"], header.headers["x-frugal-reason"]) == (
        "local",
        "accepted",
    )
    assert (legacy.headers["x-frugal-route"], legacy.headers["x-frugal-reason"]) == (
        "api",
        "low_quality",
    )
    assert [sent["model"] for _, _, sent in fake_api.requests] == ["strict-model"] * 2
    ledger = [
        (row["requested_model"], row["route"], row["reason"])
        for row in rows(tmp_path / "ledger.db")
    ]
    assert ledger == [
        ("lenient-model", "local", "accepted"),
        ("strict-model", "api", "low_quality"),
        ("strict-model", "local", "accepted"),
        ("strict-model", "api", "low_quality"),
    ]
    assert health["quality_threshold"] == 0.6
    assert health["quality_thresholds_by_model"] == thresholds


async def test_forced_api_route_skips_the_local_model(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, engine: LocalEngine
) -> None:
    before = engine.stats.completed
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": FACT},
            headers={"x-frugal-route": "api"},
        )
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("api", "forced")
    assert r.headers["x-frugal-quality"] == "none"
    assert engine.stats.completed == before
    assert fake_api.count == 1


async def test_model_local_never_falls_back_even_when_rejected(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "local", "messages": FACT, "max_tokens": 8},
            headers={"x-frugal-min-quality": "1.0"},
        )
        forced_api = await client.post(
            "/v1/chat/completions",
            json={"model": "local", "messages": FACT},
            headers={"x-frugal-route": "api"},
        )
    assert r.status_code == 200
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("local", "forced")
    assert fake_api.count == 0
    assert forced_api.status_code == 400
    assert forced_api.json()["error"]["param"] == "model"


async def test_without_a_fallback_a_rejected_answer_is_still_returned(
    tmp_path: Path, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, None)) as client:
        health = (await client.get("/healthz")).json()
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 8},
            headers={"x-frugal-min-quality": "1.0"},
        )
    assert health["fallback"] == {"configured": False, "api_base": None, "mode": "local_only"}
    assert r.status_code == 200
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("local", "no_fallback")
    assert r.json()["choices"][0]["message"]["content"]


async def test_verify_stream_replays_the_scored_local_answer(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, quality={"threshold": 0.0})
    request = {"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 16}
    async with make_client(settings) as client:
        plain = (await client.post("/v1/chat/completions", json=request)).json()
        r = await client.post(
            "/v1/chat/completions",
            json={**request, "stream": True, "stream_options": {"include_usage": True}},
        )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("local", "accepted")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == plain["usage"]
    assert len(rows(tmp_path / "ledger.db")) == 2


async def test_live_stream_sends_local_tokens_as_they_come(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    request = {"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 16, "stream": True}
    async with make_client(settings) as client:
        r = await client.post("/v1/chat/completions", json=request)
    assert r.status_code == 200
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("local", "live")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(content) >= 2 and all(content)
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert row["route"] == "local" and row["quality"] is not None


async def test_streamed_fallback_relays_the_api_stream(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(reply="Paris is the answer.")
    request = {"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 16, "stream": True}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions", json=request, headers={"x-frugal-min-quality": "1"}
        )
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("api", "low_quality")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or ""
        for e in events[:-1]
        if json.loads(e)["choices"]
    )
    assert text.split() == "Paris is the answer.".split()
    # The client did not ask for usage, so it sees none, but the ledger still costs the call.
    assert all("usage" not in json.loads(e) or json.loads(e)["usage"] is None for e in events[:-1])
    [row] = rows(tmp_path / "ledger.db")
    assert row["completion_tokens"] == 4 and row["api_cost_pusd"] > 0


async def test_stream_cut_by_the_api_ends_with_an_error_event(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(reply="one two three four five six", cut_stream_after=3)
    request = {"model": "gpt-4o-mini", "messages": FACT, "stream": True}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions", json=request, headers={"x-frugal-route": "api"}
        )
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]  # OpenAI's error object, as a JSON error carries it
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (
        "upstream_error",
        None,
        "upstream_failed",
    )
    [row] = rows(tmp_path / "ledger.db")
    assert row["error"] == "upstream_failed"


async def test_a_stream_that_fails_after_its_first_byte_ends_with_the_requests_500_event(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "SECRET-in-the-answer"

    def broken_replay(completion: dict[str, Any], **_: Any) -> Any:
        yield sse.ChunkWriter(completion["id"], completion["model"]).role()
        raise RuntimeError(secret)

    monkeypatch.setattr(sse, "replay", broken_replay)
    settings = settings_for(tmp_path, fake_api, quality={"threshold": 0.0})
    request = {"model": "gpt-4o-mini", "messages": FACT, "max_tokens": 4, "stream": True}
    async with make_client(settings) as client:
        with capture_logs() as logs:
            r = await client.post(
                "/v1/chat/completions", json=request, headers={"x-request-id": "req-mid"}
            )
    assert r.status_code == 200  # the status line was out before the failure
    events = sse_events(r.text)
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(events[-2]) == InternalError("req-mid").body()
    assert events[-1] == "[DONE]"
    failures = [e for e in logs if e["event"] == "unhandled_error"]
    assert len(failures) == 1 and failures[0]["request_id"] == "req-mid"
    assert secret not in repr(logs) and secret not in r.text
    [row] = rows(tmp_path / "ledger.db")
    assert row["error"] == "stream_failed"


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[]", 400, None),
        (b"", 400, None),
        (json.dumps({"model": "gpt-4o-mini"}).encode(), 400, "messages"),
        (json.dumps({"model": "gpt-4o-mini", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": "gpt-4o-mini", "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": FACT}).encode(), 400, "model"),
        (
            json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            400,
            "messages[0].role",
        ),
        (
            json.dumps({"model": "m", "messages": [{"role": "user"}]}).encode(),
            400,
            "messages[0].content",
        ),
        (
            json.dumps({"model": "m", "messages": FACT, "temperature": 3}).encode(),
            400,
            "temperature",
        ),
        (
            json.dumps({"model": "m", "messages": FACT, "temperature": "hot"}).encode(),
            400,
            "temperature",
        ),
        (json.dumps({"model": "m", "messages": FACT, "n": 0}).encode(), 400, "n"),
        (
            json.dumps({"model": "m", "messages": FACT, "max_tokens": -1}).encode(),
            400,
            "max_tokens",
        ),
        (json.dumps({"model": "m", "messages": FACT, "stream": "yes"}).encode(), 400, "stream"),
    ],
)
async def test_bad_input_gets_an_openai_shaped_400_naming_the_param_and_a_ledger_row(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    payload: bytes,
    status: int,
    param: str | None,
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions", content=payload, headers={"content-type": "application/json"}
        )
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    [row] = rows(tmp_path / "ledger.db")
    assert (row["status"], row["reason"], row["route"]) == (400, "bad_request", "none")
    assert fake_api.count == 0


async def test_unknown_path_and_wrong_method_are_openai_shaped(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        await assert_404_and_405(client, "/v1/nothing-here", "/v1/chat/completions")


@pytest.mark.parametrize(
    ("knobs", "status", "code"),
    [
        ({"fail_status": 500}, 502, "upstream_failed"),
        ({"hang": True}, 504, "upstream_timeout"),
        ({"fail_status": 400, "error_message": "bad model name"}, 400, None),
    ],
)
async def test_upstream_failures_map_to_gateway_errors_and_are_recorded(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    knobs: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    fake_api.set(**knobs)
    settings = settings_for(tmp_path, fake_api, fallback={"timeout_s": 0.5, "max_retries": 1})
    async with make_client(settings) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": FACT},
            headers={"x-frugal-route": "api"},
        )
    assert r.status_code == status, r.text
    if code:
        assert r.json()["error"]["code"] == code
    else:
        assert r.json()["error"]["message"] == "bad model name"
    [row] = rows(tmp_path / "ledger.db")
    assert row["status"] == status and row["route"] == "api" and row["error"]


async def test_healthz_and_models(tmp_path: Path, fake_api: FakeAPI, make_client: Any) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        health = await client.get("/healthz")
        models = await client.get("/v1/models")
    assert health.status_code == 200
    body = health.json()
    assert body["engine"]["state"] == "ready"
    assert body["engine"]["n_ctx"] == 4096
    assert body["engine"]["relevance"]["enabled"] is True, body["engine"]["relevance"]
    assert body["fallback"]["configured"] is True
    assert body["fallback"]["api_base"] == fake_api.url
    assert [m["id"] for m in models.json()["data"]][0] == "local"


async def test_every_request_has_a_request_id(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        ok = await client.get("/healthz")
        bad = await client.post(
            "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
        )
    assert len(ok.headers["x-request-id"]) >= 16
    assert bad.headers["x-request-id"] != ok.headers["x-request-id"]


def test_the_no_fallback_warning_names_what_to_set() -> None:
    from proxy.config import FallbackSettings, Settings
    from proxy.server.lifespan import _no_fallback_detail

    keyless = Settings(
        fallback=FallbackSettings(api_base="http://127.0.0.1:1/v1", api_key_env="K9")
    )
    assert "K9" in _no_fallback_detail(keyless)
    assert 'api_key_env = ""' in _no_fallback_detail(keyless)
    nothing = Settings(fallback=FallbackSettings(api_base=""))
    assert _no_fallback_detail(nothing) == "no API fallback: [fallback] api_base is empty"
