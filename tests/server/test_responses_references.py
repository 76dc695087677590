"""``item_reference`` input items against the in-process app, with the official ``openai`` SDK:
a stored input or output item put in place by its id, on SQLite and PostgreSQL, each key's own
items only, and the bound on how many one request names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.ledger.db.location import Database
from proxy.ledger.tenants import keys
from proxy.serving.responses_state import MAX_REFERENCES
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.ledger.conftest import database, pg_server  # noqa: F401 - fixtures
from tests.server.test_responses import API, QUESTION
from tests.server.test_responses_state import ALICE, BOB, CAROL, sdk  # noqa: F401 - fixture


def _ref(item_id: str) -> dict[str, str]:
    return {"type": "item_reference", "id": item_id}


async def bobs_item(client: Callable[[str], openai.AsyncOpenAI]) -> tuple[Any, Any]:
    """Bob's stored response to QUESTION (the fake API's answer), and its one output item."""
    made = await client(BOB).responses.create(
        model="gpt-4o-mini", input=QUESTION, extra_headers=API
    )
    [item] = made.output
    return made, item


async def test_item_references_put_stored_input_and_output_items_in_place(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    async with sdk() as client:
        first = await client().responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        )
        [asked] = (await client().responses.input_items.list(first.id)).data
        [answered] = first.output
        second = await client().responses.create(
            model="gpt-4o-mini",
            input=[  # type: ignore[list-item]
                _ref(asked.id),
                _ref(answered.id),
                {"role": "user", "content": "And of Italy?"},
            ],
            extra_headers=API,
        )
        listed = (await client().responses.input_items.list(second.id, order="asc")).data
    assert second.output_text == fake_api.reply
    sent = [body["messages"] for _path, _headers, body in fake_api.requests]
    assert sent[1] == [
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": fake_api.reply},
        {"role": "user", "content": "And of Italy?"},  # sent as given: a string
    ]
    assert [item.id for item in listed[:2]] == [asked.id, answered.id]


async def test_another_keys_item_is_not_found_and_an_admin_may_name_it(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    async with sdk(keys=True) as client:
        _made, item = await bobs_item(client)
        errors = []
        for item_id in (item.id, "msg_never_stored"):
            with pytest.raises(openai.BadRequestError) as caught:
                await client(CAROL).responses.create(
                    model="gpt-4o-mini",
                    input=[{"role": "user", "content": "hi"}, _ref(item_id)],  # type: ignore[list-item]
                    extra_headers=API,
                )
            errors.append(caught.value.body)
        admin = await client(ALICE).responses.create(
            model="gpt-4o-mini",
            input=[_ref(item.id)],
            extra_headers=API,  # type: ignore[list-item]
        )
    assert [(e["param"], e["code"]) for e in errors] == [("input[1].id", "not_found")] * 2  # type: ignore[index]
    # The same 400 as an id never stored: carol cannot tell that bob's exists.
    assert errors[1]["message"] == errors[0]["message"].replace(item.id, "msg_never_stored")  # type: ignore[index]
    assert admin.output_text == fake_api.reply
    assert len(fake_api.requests) == 2  # carol's requests reached no upstream


async def test_too_many_references_or_a_malformed_one_is_a_400_naming_it(
    sdk: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    cases = [
        ([_ref(f"msg_{i}") for i in range(MAX_REFERENCES + 1)], "input"),
        ([{"type": "item_reference"}], "input[0].id"),
        ([{"role": "user", "content": "hi"}, {**_ref("msg_1"), "text": "x"}], "input[1].text"),
    ]
    params = []
    async with sdk() as client:
        for given, _param in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await client().responses.create(
                    model="gpt-4o-mini",
                    input=given,  # type: ignore[arg-type]
                    extra_headers=API,
                )
            params.append(caught.value.body["param"])  # type: ignore[index]
    assert params == [param for _given, param in cases]
    assert fake_api.requests == []


async def test_a_reference_is_found_by_its_exact_id_on_either_ledger_backend(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    database: Database,  # noqa: F811
) -> None:
    """Ids with LIKE's wildcards in them (``%``, ``_``) name their own item only."""
    ledger: dict[str, Any] = {"path": str(tmp_path / "ledger.db"), "flush_interval_s": 0.02}
    if database.is_postgres:
        ledger["url"] = database.url
    dave = keys.create(database, "dave")
    async with make_client(settings_for(tmp_path, fake_api, ledger=ledger)) as http:
        client = openai.AsyncOpenAI(
            api_key=dave, base_url="http://localhost/v1", http_client=http, max_retries=0
        )
        for item_id, text in (("msg_a%b", "first"), ("msg_aXb", "second")):
            await client.responses.create(
                model="gpt-4o-mini",
                input=[{"id": item_id, "role": "user", "content": text}],  # type: ignore[list-item]
                extra_headers=API,
            )
        await client.responses.create(
            model="gpt-4o-mini",
            input=[_ref("msg_a%b")],
            extra_headers=API,  # type: ignore[list-item]
        )
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gpt-4o-mini",
                input=[_ref("msg_a_b")],
                extra_headers=API,  # type: ignore[list-item]
            )
    assert caught.value.body["param"] == "input[0].id"  # type: ignore[index]
    last = fake_api.requests[-1][2]
    assert last["input"][0]["content"] == [{"type": "input_text", "text": "first"}]
    assert len(fake_api.requests) == 3
