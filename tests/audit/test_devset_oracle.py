"""The stand-in API and judge of ``bench/audit_loop.py`` (``tests/fake_api.DevSetOracle``), over
real HTTP: right answers to dev-set prompts, and verdicts under the notion the judge's system
message names."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from proxy.audit.judge import Transport, ask_judge, judge_body
from tests.audit.judge_server import http_transport
from tests.fake_api import DevSetOracle, FakeAPI

QUESTION = "What is the capital of Japan? Answer with one word."  # factual-13 of the dev set
MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def api() -> Iterator[FakeAPI]:
    with FakeAPI(oracle=DevSetOracle(), record=False) as server:
        yield server


@pytest.fixture
async def post(api: FakeAPI) -> AsyncIterator[Transport]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield http_transport(client, api.url)


async def verdict(post: Transport, candidate: str, correctness: str) -> bool | None:
    body = judge_body(
        model="judge",
        messages=MESSAGES,
        reference="Tokyo",
        candidate=candidate,
        correctness=correctness,
    )
    return (await ask_judge(post, body)).correct


async def test_a_dev_prompt_gets_its_right_answer(post: Transport) -> None:
    reply = await post({"model": "m", "messages": MESSAGES})
    assert reply["choices"][0]["message"]["content"] == "(reference answer)"
    sum_ = await post({"model": "m", "messages": [{"role": "user", "content": "What is 17 + 25?"}]})
    assert sum_["choices"][0]["message"]["content"] == "42"


async def test_the_judge_grades_under_the_notion_its_system_message_names(
    post: Transport,
) -> None:
    prose = "The capital of Japan is Tokyo."
    assert await verdict(post, prose, "strict") is False  # one word was asked for
    assert await verdict(post, prose, "content") is True
    assert await verdict(post, "Tokyo", "strict") is True
    assert await verdict(post, "The capital of Japan is Kyoto.", "content") is False


async def test_a_judge_told_no_known_notion_gives_no_verdict(post: Transport) -> None:
    body = judge_body(
        model="judge", messages=MESSAGES, reference="Tokyo", candidate="Tokyo", correctness="strict"
    )
    body["messages"][0]["content"] = "Grade this as you like."
    outcome = await ask_judge(post, body)
    assert outcome.correct is None and outcome.error == "garbage"
