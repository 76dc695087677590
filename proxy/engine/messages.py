"""A chat request's messages as chat templates take them: text content and the classic roles.

OpenAI's content may be a list of parts (only the text parts count here) and its roles include
``developer``, which templates know as ``system``; tool calls and tool results are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["template_messages", "text_of"]


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages reduced to what chat templates understand: string content, classic roles."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "user")
        if role == "developer":
            role = "system"
        item: dict[str, Any] = {"role": role, "content": text_of(message.get("content"))}
        if message.get("tool_calls"):
            item["tool_calls"] = message["tool_calls"]
        if message.get("tool_call_id"):
            item["tool_call_id"] = message["tool_call_id"]
        out.append(item)
    return out
