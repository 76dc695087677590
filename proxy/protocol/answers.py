"""The engine's completion as OpenAI sends it, in JSON (and, replayed, in SSE).

    public_answer(completion, body, text=False)   private fields removed (``frugal``), usage in
                                                  OpenAI's keys, logprobs only as the request
                                                  asked for them (chat, or legacy text)
    public_usage(usage)                           the engine's usage in OpenAI's keys (the
                                                  replayed streams' last chunk too)

Shared by the endpoints (``proxy.server``) and a batch line's local attempt
(``proxy.serving.batch_attempt``), which answers a line as the endpoint would. Imports nothing
of the proxy's.
"""

from __future__ import annotations

from typing import Any


def public_answer(
    completion: dict[str, Any], body: dict[str, Any], *, text: bool = False
) -> dict[str, Any]:
    """The engine's completion as OpenAI sends it: private fields removed, usage in OpenAI's
    keys, logprobs only as ``body`` asked for them, and ``model`` the one ``body`` asked for
    (the local model's own name is the ``x-frugal-local-model`` header and the ledger's).

    ``text``: a legacy text completion, where ``logprobs`` is a count (0: the chosen tokens'
    logprobs without the top ones); else a chat completion, where ``logprobs`` is a flag and
    ``top_logprobs`` the count (0 or absent: every entry's ``top_logprobs`` empty).
    """
    out = {k: v for k, v in completion.items() if k != "frugal"}
    if isinstance(body.get("model"), str):  # the asked model, as llama-server's aliases answer
        out["model"] = body["model"]
    out["usage"] = public_usage(completion.get("usage") or {})
    out["choices"] = [_public_choice(choice, body, text) for choice in completion["choices"]]
    return out


def _public_choice(choice: dict[str, Any], body: dict[str, Any], text: bool) -> dict[str, Any]:
    logprobs = choice.get("logprobs")
    wanted = body.get("logprobs")
    if (wanted is None if text else not wanted) or not isinstance(logprobs, dict):
        return {**choice, "logprobs": None}
    if text and not wanted:
        return {**choice, "logprobs": {**logprobs, "top_logprobs": None}}
    if not text and not body.get("top_logprobs") and logprobs.get("content"):
        content = [{**entry, "top_logprobs": []} for entry in logprobs["content"]]
        return {**choice, "logprobs": {**logprobs, "content": content}}
    return choice


def public_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The engine's usage in OpenAI's keys (its own details left out)."""
    public = {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
    if usage.get("completion_tokens_details"):
        public["completion_tokens_details"] = usage["completion_tokens_details"]
    return public
