"""Legacy ``/v1/completions`` through a remote backend, with the server played by
``httpx.MockTransport``: which kinds take them and which requests stay with the bundled engine,
what is sent, and how the answer is checked and scored (the real ``llama_cpp.server`` is in
``test_llama_cpp_server.py``)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from proxy.routing.base import BackendDown
from proxy.routing.remote_kinds import KINDS
from proxy.routing.remote_wire import Wire, completion_body
from tests.routing.test_backends import remote

PROMPT = {"model": "gpt-4o-mini", "prompt": "The capital of France is", "max_tokens": 8}
CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 8,
}


def chat_answer(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-remote",
        "object": "chat.completion",
        "created": 0,
        "model": "local",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9},
    }


def text_answer(*texts: str, model: str = "local") -> dict[str, Any]:
    return {
        "id": "cmpl-remote",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "text": text,
                "index": i,
                "logprobs": {
                    "tokens": [text],
                    "token_logprobs": [-0.05],
                    "top_logprobs": [{text: -0.05}],
                    "text_offset": [24],
                },
                "finish_reason": "stop",
            }
            for i, text in enumerate(texts)
        ],
        "usage": {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9},
    }


@pytest.mark.parametrize(
    ("kind", "request_", "refused"),
    [
        ("llama-cpp-python", {}, None),
        ("llama-server", {"prompt": ["one prompt"]}, None),
        ("vllm", {"n": 2}, None),
        ("frugal", {"n": 3}, None),
        ("openai-compatible", {}, None),
        ("ollama", {}, "legacy completions"),
        ("llama-cpp-python", {"n": 2}, None),  # made up for by two calls
        ("llama-cpp-python", {"n": 9}, "n = 9 (at most 8)"),
        ("vllm", {"prompt": ["a", "b"]}, "several prompts"),
        ("frugal", {"prompt": [1, 2, 3]}, "a token-id prompt (ids of the bundled model's "),
        ("vllm", {"echo": True}, "echo"),
        ("vllm", {"suffix": "end"}, "suffix"),
        ("vllm", {"logit_bias": {"42": 5}}, "logit_bias"),
        ("vllm", {"best_of": 2}, "best_of > 1"),
    ],
)
def test_a_kind_takes_a_legacy_completion_with_one_string_prompt(
    kind: str, request_: dict[str, Any], refused: str | None
) -> None:
    why = KINDS[kind].refuses({**PROMPT, **request_}, "complete")
    if refused is None:
        assert why is None
    else:
        assert why is not None and why.startswith(refused)
    # the chat facts stay as they were for the same kind
    assert KINDS[kind].refuses({"messages": []}) is None


def test_a_legacy_completion_is_sent_in_the_kinds_words() -> None:
    body = completion_body(
        {**PROMPT, "prompt": ["one"], "stream": True, "user": "u"},
        Wire(model="local", cap=8, logprobs=True, kind=KINDS["vllm"]),
    )
    # one string prompt; never streamed (scored whole); logprobs (a count) asked for the gate
    assert body == {"model": "local", "prompt": "one", "max_tokens": 8, "logprobs": 1}
    # llama-cpp-python computes logprobs in Python: not asked for the gate; the client's kept
    slow = KINDS["llama-cpp-python"]
    plain = {k: v for k, v in PROMPT.items() if k != "max_tokens"}
    body = completion_body(plain, Wire(model="local", cap=16, logprobs=False, kind=slow))
    assert body == {"model": "local", "prompt": PROMPT["prompt"], "max_tokens": 16}
    asked = completion_body(
        {**PROMPT, "logprobs": 0}, Wire(model="m", cap=8, logprobs=False, kind=slow)
    )
    assert asked["logprobs"] == 0


async def test_a_backend_answers_a_legacy_completion_each_choice_scored() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        body = json.loads(request.content)
        sent.append((request.url.path, body))
        texts = [" Paris.", " I cannot help with that."][: body.get("n") or 1]
        return httpx.Response(200, json=text_answer(*texts))

    async with remote(handler, kind="frugal") as backend:
        assert backend.admits({**PROMPT, "n": 2}, "complete")
        completion = await backend.chat(
            {**PROMPT, "n": 2}, deadline=time.monotonic() + 10, kind="complete"
        )
        one = await backend.chat(PROMPT, deadline=time.monotonic() + 10, kind="complete")
    assert [path for path, _ in sent] == ["/v1/completions", "/v1/completions"]
    assert sent[0][1]["n"] == 2 and sent[0][1]["model"] == "local"
    info = completion["frugal"]
    assert info["backend"] == "gpu" and info["stop_cause"] == "eos"
    assert [c["text"] for c in completion["choices"]] == [" Paris.", " I cannot help with that."]
    # the request's score is the worst choice's, as the engine's merge keeps it
    assert one["frugal"]["quality"]["value"] is not None
    assert len(one["choices"]) == 1
    assert info["quality"]["value"] < one["frugal"]["quality"]["value"]


async def test_a_chat_answer_to_a_legacy_completion_is_a_wrong_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]}
        return httpx.Response(200, json={**text_answer("x"), **chat})

    async with remote(handler) as backend:
        with pytest.raises(BackendDown, match="not a text completion"):
            await backend.chat(PROMPT, deadline=time.monotonic() + 10, kind="complete")
        assert backend.state == "down"
        assert "wrong answer: its answer is not a text completion" in str(backend.last_down)


# -- n where the server ignores it ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["chat", "complete"])
async def test_n_where_the_server_ignores_it_is_one_call_per_answer_each_scored(
    kind: str,
) -> None:
    sent: list[dict[str, Any]] = []
    texts = [" Paris.", " I cannot help with that.", " Paris is the capital."]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/docs":
            return httpx.Response(200, text="<html></html>")
        body = json.loads(request.content)
        sent.append(body)
        text = [*texts, " Paris."][len(sent) - 1]  # the last: the lone answer
        if kind == "complete":
            return httpx.Response(200, json=text_answer(text))
        return httpx.Response(200, json=chat_answer(text))

    request = dict(PROMPT) if kind == "complete" else dict(CHAT)
    async with remote(handler, kind="llama-cpp-python") as backend:
        assert backend.admits({**request, "n": 3}, kind)
        three = await backend.chat(
            {**request, "n": 3, "seed": 7}, deadline=time.monotonic() + 10, kind=kind
        )
        alone = await backend.chat(
            {**request, "seed": 8}, deadline=time.monotonic() + 10, kind=kind
        )
    # three calls of one answer each, with the engine's seeds and OpenAI's default temperature
    assert [(b["n"], b["seed"], b["temperature"]) for b in sent[:3]] == [
        (1, 7, 1.0),
        (1, 8, 1.0),
        (1, 9, 1.0),
    ]
    assert "n" not in sent[3] and sent[3]["seed"] == 8 and "temperature" not in sent[3]
    field = "text" if kind == "complete" else "message"
    got = [c[field] if kind == "complete" else c[field]["content"] for c in three["choices"]]
    assert got == texts and [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert three["usage"] == {"prompt_tokens": 6, "completion_tokens": 9, "total_tokens": 15}
    info = three["frugal"]
    assert info["answers"] == 3 and info["backend"] == "gpu"
    # each answer scored: the request's verdict is the worst one's (the refusal), below the
    # lone " Paris." answer's
    assert info["quality"]["value"] < alone["frugal"]["quality"]["value"]
