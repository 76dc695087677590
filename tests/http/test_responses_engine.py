"""The local engine's own work for ``/v1/responses`` as for chat: a chain continued with
``previous_response_id`` is prefilled from the earlier turn's reused prefix, and says so in the
Responses' usage (``input_tokens_details.cached_tokens``) and on the ledger row. The real
SmolLM2 and the official ``openai`` SDK against the in-process app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.http.test_app import rows

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
