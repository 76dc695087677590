"""The cascade on ``/v1/responses`` as on chat: the gate (a local answer scored under the bar is
not sent, the API's is, reason ``low_quality``; JSON and stream, either fallback) and predictive
routing (a local wait predicted past the deadline: the API at once, ``predicted_slow``). The
official ``openai`` SDK against the in-process app, the real SmolLM2, the fake API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.engine.local_engine import LocalEngine
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.routing.test_routing import queue_ahead
from tests.server.test_app import rows

REJECT = {"x-frugal-min-quality": "1"}  # no local answer scores 1: every one falls back


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("mode", ["responses", "translate"])
async def test_a_local_answer_under_the_bar_is_replaced_by_the_apis(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, mode: str, stream: bool
) -> None:
    settings = settings_for(tmp_path, fake_api, fallback={"responses": mode})
    async with make_client(settings) as http:
        client = openai.AsyncOpenAI(
            api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
        )
        async with client.responses.with_streaming_response.create(
            model="gpt-4o-mini",
            input="What is the capital of France?",
            max_output_tokens=12,
            stream=stream,
            extra_headers=REJECT,
        ) as raw:
            headers = raw.headers
            parsed = await raw.parse()
            final = [e async for e in parsed][-1].response if stream else parsed
    assert (headers["x-frugal-route"], headers["x-frugal-reason"]) == ("api", "low_quality")
    assert 0 <= float(headers["x-frugal-quality"]) < 1  # the local answer was scored
    assert final.output_text == fake_api.reply and final.status == "completed"
    [(path, _headers, _sent)] = fake_api.requests
    assert path == ("/v1/responses" if mode == "responses" else "/v1/chat/completions")
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["reason"]) == ("responses", "api", "low_quality")
    assert row["quality"] is not None and row["local_ms"] is not None


async def test_a_request_behind_a_long_queue_goes_to_the_apis_responses_without_waiting(
    tmp_path: Path, fake_api: FakeAPI, engine: LocalEngine, make_client: Any
) -> None:
    """Predictive routing as on chat: the local wait predicted past the deadline sends the
    request to the API at once (the upstream's own ``/v1/responses``), reason ``predicted_slow``."""
    async with queue_ahead(engine) as wait:
        settings = settings_for(tmp_path, fake_api, local={"timeout_s": max(0.2, wait / 2)})
        async with make_client(settings) as http:
            queued = engine.queue_depth
            response = await http.post(
                "/v1/responses",
                json={"model": "gpt-4o-mini", "input": "What is 2 + 2?", "max_output_tokens": 8},
            )
            assert engine.queue_depth == queued  # it never joined the queue
    assert response.status_code == 200, response.text
    assert (response.headers["x-frugal-route"], response.headers["x-frugal-reason"]) == (
        "api",
        "predicted_slow",
    )
    assert response.json()["output"][0]["content"][0]["text"] == fake_api.reply
    [(path, _headers, _sent)] = fake_api.requests
    assert path == "/v1/responses"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["reason"], row["local_ms"]) == ("responses", "predicted_slow", 0)
    assert row["predicted_local_ms"] is not None
