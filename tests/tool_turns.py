"""The ``get_weather`` tool, for the tests that send one: the chat function tool itself, and a
conversation's tool turns (an assistant turn that called it, call ``call_1``, and the tool's
answer)."""

from __future__ import annotations

import copy
from typing import Any

_CITY: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def weather_tool(description: str | None = None) -> dict[str, Any]:
    """The chat function tool ``get_weather``, whose one parameter is a required ``city``."""
    described = {} if description is None else {"description": description}
    function = {"name": "get_weather", **described, "parameters": copy.deepcopy(_CITY)}
    return {"type": "function", "function": function}


def weather_turns(result: str, *, arguments: str = '{"city": "Paris"}') -> list[dict[str, Any]]:
    """The assistant's call of ``get_weather`` with ``arguments``, then the tool's ``result``."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]
