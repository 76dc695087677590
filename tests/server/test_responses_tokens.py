"""``POST /v1/responses/input_tokens`` against the in-process app, with the official ``openai``
SDK: the count the ledger makes with the requested model's tokenizer, the earlier turns and
item references counted, a key's own stored responses only, no ledger row, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import tiktoken

from tests.fake_api import FakeAPI
from tests.server.test_app import rows
from tests.server.test_responses import LOCAL, QUESTION, WEATHER
from tests.server.test_responses_references import bobs_item
from tests.server.test_responses_state import BOB, CAROL, sdk  # noqa: F401 - fixture

INSTRUCTIONS = "Answer in one word."


async def test_the_count_is_the_ledgers_count_of_the_same_request(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
    tmp_path: Path,
) -> None:
    async with sdk() as client:
        answered = await client().responses.create(
            model="gpt-4o-mini",
            instructions=INSTRUCTIONS,
            input=QUESTION,
            max_output_tokens=8,
            extra_headers=LOCAL,
        )
        counted = await client().responses.input_tokens.count(
            model="gpt-4o-mini", instructions=INSTRUCTIONS, input=QUESTION
        )
        bare = await client().responses.input_tokens.count(model="gpt-4o-mini", input=QUESTION)
        with_tools = await client().responses.input_tokens.count(
            model="gpt-4o-mini",
            instructions=INSTRUCTIONS,
            input=QUESTION,
            tools=[WEATHER],  # type: ignore[list-item]
        )
        followed = await client().responses.input_tokens.count(
            model="gpt-4o-mini", input="And of Italy?", previous_response_id=answered.id
        )
    assert counted.object == "response.input_tokens"
    [row] = rows(tmp_path / "ledger.db")  # the counts wrote no row
    assert row["route"] == "local"
    assert counted.input_tokens == row["counterfactual_prompt_tokens"]
    # gpt-4o-mini's o200k: 3 tokens per message, its role and text, and 3 to prime the reply.
    o200k = tiktoken.get_encoding("o200k_base")
    user = 3 + len(o200k.encode("user")) + len(o200k.encode(QUESTION))
    assert bare.input_tokens == user + 3
    assert with_tools.input_tokens > counted.input_tokens > bare.input_tokens
    assert followed.input_tokens > counted.input_tokens  # the earlier turn is counted
    assert fake_api.requests == []


async def test_references_and_earlier_turns_are_a_keys_own(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    async with sdk(keys=True) as client:
        made, item = await bobs_item(client)
        own = await client(BOB).responses.input_tokens.count(
            model="gpt-4o-mini",
            input=[{"type": "item_reference", "id": item.id}],  # type: ignore[list-item]
        )
        with pytest.raises(openai.BadRequestError) as reference:
            await client(CAROL).responses.input_tokens.count(
                model="gpt-4o-mini",
                input=[{"type": "item_reference", "id": item.id}],  # type: ignore[list-item]
            )
        with pytest.raises(openai.NotFoundError) as previous:
            await client(CAROL).responses.input_tokens.count(
                model="gpt-4o-mini", input="hi", previous_response_id=made.id
            )
    o200k = tiktoken.get_encoding("o200k_base")
    assert (
        own.input_tokens
        == 3 + len(o200k.encode("assistant")) + len(o200k.encode(fake_api.reply)) + 3
    )
    assert reference.value.body["param"] == "input[0].id"  # type: ignore[index]
    assert previous.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_bad_input_is_a_400_naming_the_parameter(
    sdk: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "hi"}, "model"),
        ({"model": "gpt-4o-mini", "input": "hi", "stream": True}, "stream"),
        ({"model": "gpt-4o-mini", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "gpt-4o-mini", "input": "hi", "conversation": "conv_1"}, "conversation"),
    ]
    params = []
    async with sdk() as client:
        for body, _param in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await client().post(
                    "/responses/input_tokens", cast_to=object, body=body, options={}
                )
            params.append(caught.value.body["param"])  # type: ignore[index]
    assert params == [param for _body, param in cases]
    assert rows(tmp_path / "ledger.db") == []
