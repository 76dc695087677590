"""The engine's completion as OpenAI sends it (proxy/protocol/answers.py): private fields removed,
logprobs only as the request asked for them."""

from __future__ import annotations

from typing import Any

from proxy.protocol.answers import public_answer


def _completion(choice: dict[str, Any]) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4, "private": 1}
    return {"id": "x", "model": "local", "choices": [choice], "usage": usage, "frugal": {}}


def test_a_chat_answer_keeps_logprobs_only_as_asked() -> None:
    entry = {"token": "Paris", "logprob": -0.1, "top_logprobs": [{"token": "Paris"}]}
    completion = _completion({"index": 0, "logprobs": {"content": [entry]}})
    plain = public_answer(completion, {})
    assert "frugal" not in plain and plain["choices"][0]["logprobs"] is None
    assert plain["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    without_top = public_answer(completion, {"logprobs": True})
    assert without_top["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert entry["top_logprobs"] == [{"token": "Paris"}]  # the engine's own is left alone
    with_top = public_answer(completion, {"logprobs": True, "top_logprobs": 1})
    assert with_top["choices"][0]["logprobs"]["content"] == [entry]


def test_a_text_answer_keeps_logprobs_only_as_asked() -> None:
    lp = {"tokens": ["Paris"], "token_logprobs": [-0.1], "top_logprobs": [{"Paris": -0.1}]}
    completion = _completion({"index": 0, "text": "Paris", "logprobs": lp})
    assert public_answer(completion, {}, text=True)["choices"][0]["logprobs"] is None
    chosen = public_answer(completion, {"logprobs": 0}, text=True)["choices"][0]["logprobs"]
    assert chosen == {**lp, "top_logprobs": None}
    assert public_answer(completion, {"logprobs": 1}, text=True)["choices"][0]["logprobs"] == lp
    bare = _completion({"index": 0, "text": "Paris", "logprobs": None})
    assert public_answer(bare, {"logprobs": 1}, text=True)["choices"][0]["logprobs"] is None
