"""A chain local -> API -> local on ``/v1/responses`` (``previous_response_id`` each turn): every
turn is given the whole conversation, whichever route answered the turns before it: the API its
own ``/v1/responses`` input, the local model its chat messages (seen in the content log,
``[server] log_content``). The official ``openai`` SDK against the in-process app, the real
SmolLM2, the fake API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
from structlog.testing import capture_logs

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows

LOCAL = {"x-frugal-route": "local"}
API = {"x-frugal-route": "api"}
QUESTION = "What is the capital of France?"


def _text(content: Any) -> str:
    """A chat message's text, given as a string or as text parts."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


async def local_then_api(
    client: openai.AsyncOpenAI, local: dict[str, str], max_output_tokens: int
) -> tuple[Any, Any, Any]:
    """QUESTION answered on the local route (the headers ``local``), then "And of Italy?"
    chained to it on the API route: (the first raw reply, the first response, the second)."""
    first = await client.responses.with_raw_response.create(
        model="gpt-4o-mini",
        input=QUESTION,
        max_output_tokens=max_output_tokens,
        extra_headers=local,
    )
    one = first.parse()
    two = await client.responses.create(
        model="gpt-4o-mini", input="And of Italy?", previous_response_id=one.id, extra_headers=API
    )
    return first, one, two


async def test_local_then_api_then_local_each_turn_gets_the_whole_conversation(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, server={"log_content": True})
    async with make_client(settings) as http:
        client = openai.AsyncOpenAI(
            api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
        )
        with capture_logs() as logs:
            first, one, two = await local_then_api(client, LOCAL, 12)
            third = await client.responses.with_raw_response.create(
                model="gpt-4o-mini",
                input="Thanks. And of Spain?",
                previous_response_id=two.id,
                max_output_tokens=12,
                extra_headers=LOCAL,
            )
            three = third.parse()
    assert (first.headers["x-frugal-route"], third.headers["x-frugal-route"]) == ("local",) * 2
    assert three.previous_response_id == two.id and three.output_text
    # The API was sent the first (local) turn.
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses" and sent["store"] is False
    assert [item["content"][0]["text"] for item in sent["input"]] == [
        QUESTION,
        one.output_text,
        "And of Italy?",
    ]
    # The local model was sent both earlier turns, the API's answer among them.
    [content] = [
        e
        for e in logs
        if e["event"] == "request_content" and e["request_id"] == third.headers["x-request-id"]
    ]
    assert [(m["role"], _text(m["content"])) for m in content["messages"]] == [
        ("user", QUESTION),
        ("assistant", one.output_text),
        ("user", "And of Italy?"),
        ("assistant", fake_api.reply),
        ("user", "Thanks. And of Spain?"),
    ]
    routes = [row["route"] for row in rows(tmp_path / "ledger.db")]
    assert sorted(routes) == ["api", "local", "local"]
