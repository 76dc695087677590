"""The OpenAI ``chat.completion`` that a local answer is returned as, by either decoding path.

The single path (:meth:`proxy.engine.generate.LocalModel.chat`) and the batch
(:meth:`proxy.engine.batch.decode.BatchEngine.completion`) answer in one shape: one choice with its
text, token logprobs and finish reason, the usage, and ``frugal``: what the proxy needs besides
(``stop_cause``, the prefill and decode times, the cached and prefilled prompt tokens, the
speculation counts, and what the batch adds).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

__all__ = ["chat_completion"]


def chat_completion(
    *,
    model: str,
    text: str,
    entries: list[dict[str, Any]],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    prefilled_tokens: int,
    stop_cause: str | None,
    prefill_s: float,
    decode_s: float,
    speculative: dict[str, Any] | None,
    **frugal: Any,
) -> dict[str, Any]:
    """A ``chat.completion`` dict; ``frugal`` keywords are added to its ``frugal`` details."""
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": {"content": entries, "refusal": None},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
        "frugal": {
            "stop_cause": stop_cause or "eos",
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "cached_tokens": cached_tokens,
            "prefilled_tokens": prefilled_tokens,
            "speculative": speculative,
            **frugal,
        },
    }
