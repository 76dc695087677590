"""``POST /v1/responses/compact`` and ``compaction`` input items against the in-process app, with
the official ``openai`` SDK: relayed to the upstream's own Responses API and billed as an API
call; with ``[fallback] responses = "translate"``, a 400 naming the parameter."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.ledger.db.location import Database
from proxy.ledger.tenants import keys
from tests.conftest import AppFactory
from tests.fake_api import FakeAPI
from tests.ledger.conftest import database, pg_server  # noqa: F401 - fixtures
from tests.server.test_app import rows
from tests.server.test_responses import API, QUESTION
from tests.server.test_responses_state import sdk  # noqa: F401 - fixture
from tests.serving.test_budgets import spend

OWN = {"fallback": {"responses": "responses"}}


async def test_compact_sends_the_whole_conversation_and_bills_the_call(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
    tmp_path: Path,
) -> None:
    async with sdk(**OWN) as client:
        first = await client().responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        )
        raw = await client().responses.with_raw_response.compact(
            model="gpt-4o-mini", input="And of Italy?", previous_response_id=first.id
        )
        compacted = raw.parse()
    assert raw.headers["x-frugal-route"] == "api"
    assert raw.headers["x-frugal-reason"] == "unsupported"
    assert compacted.object == "response.compaction"
    [*users, compaction] = compacted.output
    assert compaction.type == "compaction"
    assert compaction.encrypted_content == "compacted:3"  # type: ignore[union-attr]
    assert [u.content[0].text for u in users] == [QUESTION, "And of Italy?"]  # type: ignore[union-attr]
    path, _headers, sent = fake_api.requests[-1]
    assert path == "/v1/responses/compact"
    assert [item["role"] for item in sent["input"]] == ["user", "assistant", "user"]
    assert all("id" not in item for item in sent["input"])  # none of our ids leave the proxy
    assert "previous_response_id" not in sent
    written = rows(tmp_path / "ledger.db")
    assert [(r["endpoint"], r["route"], r["reason"], r["status"]) for r in written] == [
        ("responses", "api", "forced", 200),
        ("responses_compact", "api", "unsupported", 200),
    ]
    assert written[1]["prompt_tokens"] == compacted.usage.input_tokens
    assert written[1]["completion_tokens"] == 1
    # gpt-4o-mini's prices: $0.15 and $0.60 a million tokens, in pico-dollars a token
    assert written[1]["api_cost_pusd"] == compacted.usage.input_tokens * 150_000 + 600_000


async def test_a_compaction_item_goes_to_the_upstreams_own_responses(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    item = {"type": "compaction", "encrypted_content": "compacted:2"}
    async with sdk(**OWN) as client:
        raw = await client().responses.with_raw_response.create(
            model="gpt-4o-mini",
            input=[item, {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
            store=False,
        )
    assert raw.headers["x-frugal-route"] == "api"
    assert raw.headers["x-frugal-reason"] == "unsupported"
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses" and sent["input"][0] == item


async def test_with_translate_compaction_is_a_400_naming_the_parameter(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    params = []
    async with sdk() as client:  # [fallback] responses = "translate"
        with pytest.raises(openai.BadRequestError) as compact:
            await client().responses.compact(model="gpt-4o-mini", input=QUESTION)
        params.append(compact.value.body["param"])  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as item:
            await client().responses.create(
                model="gpt-4o-mini",
                input=[{"type": "compaction", "encrypted_content": "x"}],  # type: ignore[list-item]
                extra_headers=API,
            )
        params.append(item.value.body["param"])  # type: ignore[index]
    assert params == ["model", "input[0].type"]
    assert fake_api.requests == []


async def test_a_compaction_past_the_keys_budget_is_refused_before_the_call(
    open_app: AppFactory,
    fake_api: FakeAPI,
    database: Database,  # noqa: F811
) -> None:
    # A compaction asks for no output bound: its worst case is gpt-4o-mini's own, 16,384
    # output tokens ($0.0098). 20,000 words (100,000 bytes) add 50,000 prompt tokens ($0.0075):
    # more than the $0.015 budget; a short input adds a few micro-dollars and fits.
    budget = 15_000_000_000
    auth = {"authorization": f"Bearer {keys.create(database, 'small', monthly_budget_pusd=budget)}"}
    async with open_app() as client:
        long = await client.post(
            "/v1/responses/compact",
            json={"model": "gpt-4o-mini", "input": "word " * 20_000},
            headers=auth,
        )
        short = await client.post(
            "/v1/responses/compact",
            json={"model": "gpt-4o-mini", "input": QUESTION},
            headers=auth,
        )
        await asyncio.sleep(0.3)  # the settles run in the background
    assert long.status_code == 429, long.text
    assert long.json()["error"]["code"] == "insufficient_quota"
    assert short.status_code == 200, short.text
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/responses/compact"]
    spent, reserved = spend(database, "small")
    assert 0 < spent <= budget and reserved == 0
