"""The judge protocol, against a judge served on a real loopback port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from proxy.audit.judge import (
    RESPONSE_FORMAT,
    SYSTEM_MESSAGES,
    Transport,
    ask_judge,
    judge_body,
    read_verdict,
)
from tests.audit.judge_server import JudgeServer, http_transport

MESSAGES = [
    {"role": "system", "content": "Answer with the number only."},
    {"role": "user", "content": "What is 6 times 7?"},
]


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer().start()
    yield server
    server.stop()


@pytest.fixture
def judge(judge_server: JudgeServer) -> JudgeServer:
    judge_server.mode = "grade"
    judge_server.requests.clear()
    return judge_server


@pytest.fixture
async def transport(judge: JudgeServer) -> AsyncIterator[Transport]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        yield http_transport(client, judge.url)


def body(candidate: str, reference: str = "42", correctness: str = "strict") -> dict[str, Any]:
    return judge_body(
        model="judge-model",
        messages=MESSAGES,
        reference=reference,
        candidate=candidate,
        correctness=correctness,
    )


def test_the_body_is_the_protocol() -> None:
    b = body("The answer is 42.")
    assert b["model"] == "judge-model" and b["stream"] is False
    assert b["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "frugal_verdict",
            "schema": {
                "type": "object",
                "properties": {"correct": {"type": "boolean"}, "reason": {"type": "string"}},
                "required": ["correct"],
            },
        },
    }
    assert b["response_format"] == RESPONSE_FORMAT
    system, user = b["messages"]
    assert system == {"role": "system", "content": SYSTEM_MESSAGES["strict"]}
    assert user["role"] == "user"
    assert json.loads(user["content"]) == {
        "request": MESSAGES,
        "reference": "42",
        "candidate": "The answer is 42.",
    }


def test_the_system_message_says_what_correct_means() -> None:
    strict, content = SYSTEM_MESSAGES["strict"], SYSTEM_MESSAGES["content"]
    assert "every explicit instruction" in strict and "only the number" in strict
    assert "in any form" in content
    assert body("x", correctness="content")["messages"][0]["content"] == content
    with pytest.raises(ValueError, match="lenient"):
        body("x", correctness="lenient")


def test_text_outside_ascii_is_sent_as_is() -> None:
    user = body("Ça fait 42 €")["messages"][-1]["content"]
    assert "Ça fait 42 €" in user


async def test_a_correct_verdict(judge: JudgeServer, transport: Transport) -> None:
    outcome = await ask_judge(transport, body("42."), timeout_s=10)
    assert (outcome.correct, outcome.reason, outcome.error) == (True, "same answer", None)
    assert not outcome.failed
    assert outcome.usage == {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}
    (sent,) = judge.requests
    assert sent == body("42.")


async def test_a_wrong_verdict(transport: Transport) -> None:
    outcome = await ask_judge(transport, body("41"), timeout_s=10)
    assert outcome.correct is False and not outcome.failed


async def test_a_verdict_in_a_code_fence_is_read(judge: JudgeServer, transport: Transport) -> None:
    judge.mode = "fenced"
    assert (await ask_judge(transport, body("42"), timeout_s=10)).correct is True


@pytest.mark.parametrize(
    "garbage",
    [
        "I think it is fine.",
        '{"correct": "true"}',
        '{"reason": "looks right"}',
        '["correct", true]',
        "",
        '{"correct": true',
    ],
)
async def test_garbage_is_no_verdict(
    judge: JudgeServer, transport: Transport, garbage: str
) -> None:
    judge.mode, judge.garbage = "garbage", garbage
    outcome = await ask_judge(transport, body("42"), timeout_s=10)
    assert outcome.failed and outcome.correct is None
    assert outcome.error == "garbage"
    assert outcome.usage is not None  # the judge was paid all the same


@pytest.mark.parametrize("status", [500, 502, 503, 429, 400])
async def test_an_http_error_is_no_verdict(
    judge: JudgeServer, transport: Transport, status: int
) -> None:
    judge.mode, judge.status = "status", status
    outcome = await ask_judge(transport, body("42"), timeout_s=10)
    assert outcome.failed and outcome.error == "transport"
    assert outcome.error_type == "HTTPStatusError"


async def test_a_judge_that_never_answers_times_out(
    judge: JudgeServer, transport: Transport
) -> None:
    judge.mode = "hang"
    outcome = await ask_judge(transport, body("42"), timeout_s=0.3)
    assert outcome.failed and outcome.error == "timeout"


async def test_a_refused_connection_is_no_verdict() -> None:
    async with httpx.AsyncClient() as client:
        transport = http_transport(client, "http://127.0.0.1:9/v1")
        outcome = await ask_judge(transport, body("42"), timeout_s=10)
    assert outcome.failed and outcome.error == "transport"
    assert outcome.error_type == "ConnectError"


@pytest.mark.parametrize(
    "response",
    [
        None,
        {},
        {"choices": []},
        {"choices": [{"message": {"content": None}}]},
        {"choices": [{"message": {"content": ["x"]}}]},
        {"error": {"message": "overloaded"}},
    ],
)
def test_read_verdict_refuses_what_is_not_a_chat_completion(response: Any) -> None:
    assert read_verdict(response) is None


def test_read_verdict_bounds_the_reason() -> None:
    content = json.dumps({"correct": False, "reason": "x" * 10_000})
    verdict = read_verdict({"choices": [{"message": {"content": content}}]})
    assert verdict is not None and verdict[0] is False and len(verdict[1]) == 500
    no_reason = read_verdict({"choices": [{"message": {"content": '{"correct": true}'}}]})
    assert no_reason == (True, "")
