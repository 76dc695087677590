"""Which share of a new prompt a backend has probably cached, from the last prompts it ran.

A backend's KV cache keeps the prompt it ran last (and the bundled engine's prefix cache a few
more), so a prompt that shares a long prefix with one of them is prefilled only past it.
:class:`PrefixMemory` remembers a backend's last prompts as text and answers the longest prefix
a new one shares with any of them, as a share of its length, so that the estimator counts only
the uncached part as prefill.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["PrefixMemory", "prompt_text", "shared_prefix"]


def prompt_text(request: dict[str, Any]) -> str:
    """The prompt as one string, in the order the model reads it (for prefix matching)."""
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    for message in request.get("messages") or ():
        if not isinstance(message, dict):
            continue
        parts.append(str(message.get("role") or ""))
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
            )
    return "\x00".join(parts)


def shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings: chunk by chunk (C comparisons),
    then a binary search inside the first chunk that differs."""
    n = min(len(a), len(b))
    low, step = 0, 1024
    while low < n and a[low : min(low + step, n)] == b[low : min(low + step, n)]:
        low += step
    if low >= n:
        return n
    high = min(low + step, n) - 1  # a difference lies in [low, high]: the prefix ends there
    while low < high:
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class PrefixMemory:
    """The last prompts a backend ran: the share of a new prompt it has probably cached."""

    def __init__(self, size: int = 8) -> None:
        self._recent: deque[str] = deque(maxlen=size)

    def remember(self, request: dict[str, Any]) -> None:
        text = prompt_text(request)
        if text:
            self._recent.append(text)

    def cached_share(self, request: dict[str, Any]) -> float:
        text = prompt_text(request)
        if not text or not self._recent:
            return 0.0
        best = max(shared_prefix(text, old) for old in self._recent)
        # The last token is always run again, to get the logits of the first answer token.
        return min(best / len(text), 0.99)
