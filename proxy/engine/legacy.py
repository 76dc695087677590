"""Legacy text completions (``/v1/completions``) on top of the chat token loop.

:meth:`LocalModel.complete` tokenizes the raw prompt (no chat template), runs the same loop as a
chat answer, and :func:`text_completion` reshapes the result as OpenAI's ``text_completion``.
Logprobs are always kept, in the legacy layout (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``); the proxy drops them when the client did not ask.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions


def prompt_of(llm: Any, prompt: Any) -> tuple[list[int], str]:
    """The prompt's tokens and text: from a string, or from token ids of this model."""
    if isinstance(prompt, list):
        tokens = [int(t) for t in prompt]
        text = llm.detokenize(tokens).decode("utf-8", errors="replace")
    else:
        text = "" if prompt is None else str(prompt)
        tokens = list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
    if not tokens:
        bos = llm.token_bos()
        tokens = [bos if bos >= 0 else llm.token_eos()]
    return tokens, text


def text_completion(
    chat: dict[str, Any], *, prompt_text: str, request: dict[str, Any]
) -> dict[str, Any]:
    """A ``chat.completion`` from the token loop, as a ``text_completion``."""
    choice = chat["choices"][0]
    text = choice["message"].get("content") or ""
    entries = (choice.get("logprobs") or {}).get("content") or []
    offset = len(prompt_text)
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    logprobs = {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }
    if request.get("echo"):
        text = prompt_text + text
    return {
        "id": "cmpl-" + chat["id"].removeprefix("chatcmpl-"),
        "object": "text_completion",
        "created": chat["created"],
        "model": chat["model"],
        "choices": [
            {
                "text": text,
                "index": 0,
                "logprobs": logprobs,
                "finish_reason": choice["finish_reason"],
            }
        ],
        "usage": chat["usage"],
        "frugal": chat["frugal"],
    }


def chat_view(
    request: dict[str, Any], completion: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request and one choice of a text completion as chat dicts, for the quality gate."""
    prompt = request.get("prompt")
    prompt_text = prompt if isinstance(prompt, str) else ""
    chat_request = {
        k: v for k, v in request.items() if k not in ("prompt", "echo", "logprobs", "suffix")
    }
    chat_request["messages"] = [{"role": "user", "content": prompt_text}]
    choice = completion["choices"][0]
    lp = choice.get("logprobs") or {}
    entries = [
        {"token": t, "logprob": v, "bytes": None, "top_logprobs": []}
        for t, v in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], strict=False)
    ]
    text = choice["text"]
    if request.get("echo") and text.startswith(prompt_text):
        text = text[len(prompt_text) :]
    chat_completion = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": {"content": entries},
                "finish_reason": choice["finish_reason"],
            }
        ],
        "usage": completion.get("usage"),
        "frugal": completion.get("frugal"),
    }
    return chat_request, chat_completion
