"""A usage object of either API read as the same five figures, and a Responses usage written as
chat's: the arithmetic of the wire shapes, shared by the translation (:mod:`proxy.protocol.
responses_translate`), the exchange that prices an answer, and the upstream's own
``/v1/responses`` call (:mod:`proxy.upstream.responses_api`).

    usage_figures(usage, read, written)
                    the prompt, completion, cached, reasoning and total tokens of a ``usage``
                    whose fields are named after ``read`` and ``written``
    chat_usage(usage)
                    the Responses' usage (``input_tokens``...) as the chat usage the ledger
                    prices (``prompt_tokens``...)
"""

from __future__ import annotations

from typing import Any


def usage_figures(usage: dict[str, Any], read: str, written: str) -> tuple[int, int, int, int, int]:
    """The prompt, completion, cached, reasoning and total tokens of a ``usage`` that calls the
    prompt ``{read}_tokens`` and the completion ``{written}_tokens`` (chat: ``prompt`` and
    ``completion``; Responses: ``input`` and ``output``); a field left out counts 0."""
    prompt = int(usage.get(f"{read}_tokens") or 0)
    completion = int(usage.get(f"{written}_tokens") or 0)
    cached = (usage.get(f"{read}_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get(f"{written}_tokens_details") or {}).get("reasoning_tokens") or 0
    total = int(usage.get("total_tokens") or prompt + completion)
    return prompt, completion, int(cached), int(reasoning), total


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses ``usage`` as chat's (None when there is none)."""
    if not isinstance(usage, dict) or usage.get("input_tokens") is None:
        return None
    prompt, completion, cached, reasoning, total = usage_figures(usage, "input", "output")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
