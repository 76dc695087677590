"""A conversation's tool turns, for the tests that send one: an assistant turn that called
``get_weather`` (call ``call_1``) and the tool's answer to it."""

from __future__ import annotations

from typing import Any


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
