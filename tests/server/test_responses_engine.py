"""The local engine's own work for ``/v1/responses`` as for chat: a chain continued with
``previous_response_id`` is prefilled from the earlier turn's reused prefix, and says so in the
Responses' usage (``input_tokens_details.cached_tokens``) and on the ledger row. And its batch
(two ``/v1/responses`` requests decoded together) and its speculation. The real SmolLM2 and
the in-process app."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai

from proxy.engine.local_engine import LocalEngine
from tests.conftest import settings_for
from tests.engine.test_speculative import PARAGRAPH
from tests.fake_api import FakeAPI
from tests.load_factor import settle
from tests.server.test_app import rows

LOCAL = {"x-frugal-route": "local"}
# Long enough (over 64 tokens) for its prefill to be tiled, hence reusable (prefill_plan.py).
INSTRUCTIONS = " ".join(
    ["You are a geography tutor. Answer in one short sentence, name the country and the city."] * 6
)


async def test_a_local_chain_reuses_the_earlier_turns_prefix(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as http:
        client = openai.AsyncOpenAI(
            api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
        )
        first = await client.responses.create(
            model="gpt-4o-mini",
            instructions=INSTRUCTIONS,
            input="What is the capital of France?",
            max_output_tokens=12,
            extra_headers=LOCAL,
        )
        second = await client.responses.create(
            model="gpt-4o-mini",
            instructions=INSTRUCTIONS,
            input="And of Italy?",
            previous_response_id=first.id,
            max_output_tokens=12,
            extra_headers=LOCAL,
        )
    assert first.usage is not None and second.usage is not None
    reused = second.usage.input_tokens_details.cached_tokens
    # The first prompt (instructions and question) is the second one's prefix: the engine
    # restores it (as far as it was prefilled alike, prefill_plan.reusable) and says how much.
    assert first.usage.input_tokens > 64
    assert 0 < reused < first.usage.input_tokens < second.usage.input_tokens
    assert fake_api.count == 0
    by_id = {row["request_id"]: row for row in rows(tmp_path / "ledger.db")}
    assert len(by_id) == 2
    assert sorted(row["cached_tokens"] for row in by_id.values()) == sorted(
        [first.usage.input_tokens_details.cached_tokens, reused]
    )


async def test_responses_share_the_engines_batch_with_each_other(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``[local] parallel = 2``: a second ``/v1/responses`` request joins the first one's decode
    steps instead of waiting for it."""
    settings = settings_for(tmp_path, fake_api, local={"n_ctx": 1024, "parallel": 2})
    long = {
        "model": "gpt-4o-mini",
        "input": "Write a very long story about a lighthouse keeper.",
        "max_output_tokens": 160,
    }
    short = {"model": "gpt-4o-mini", "input": "What is 2 + 2?", "max_output_tokens": 16}
    async with make_client(settings, own_engine=True) as http:
        engine: LocalEngine = http.app.state.services.engine
        running = asyncio.create_task(http.post("/v1/responses", json=long, headers=LOCAL))
        await settle(lambda: engine.active == 1, "the long one being decoded")
        assert engine.active == 1
        second = await http.post("/v1/responses", json=short, headers=LOCAL)
        first = await running
        health = engine.health()
    assert (first.status_code, second.status_code) == (200, 200)
    assert first.headers["x-frugal-route"] == second.headers["x-frugal-route"] == "local"
    assert health["parallel"] == 2
    assert health["batch"]["max_rows_per_step"] >= 2  # they did share decode steps
    assert fake_api.count == 0


async def test_a_greedy_copy_heavy_answer_is_speculated(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """Prompt-lookup speculation (``[local] speculative``, on by default) drafts a greedy
    ``/v1/responses`` answer as it drafts chat's.

    On an engine of its own: the shared one has measured its verify batches by then, and on one
    thread of this CPU a batch of several rows can cost so much that the draft policy rightly
    declines every draft. A fresh engine's first draft is priced from its start-up estimate,
    not from this machine's timing, so the request is drafted whatever the load."""
    settings = settings_for(tmp_path, fake_api, local={"parallel": 1})
    async with make_client(settings, own_engine=True) as http:
        engine: LocalEngine = http.app.state.services.engine
        made = await http.post(
            "/v1/responses",
            json={
                "model": "gpt-4o-mini",
                "input": "Fix the typos in this paragraph:\n\n" + PARAGRAPH,
                "temperature": 0,
                "max_output_tokens": 40,
            },
            headers=LOCAL,
        )
    assert made.status_code == 200, made.text
    assert made.headers["x-frugal-route"] == "local"
    assert engine.stats.speculated == 1
    assert engine.stats.drafted > 0
