"""The ``get_weather`` tool, for the tests that send one: the chat function tool itself, the
Responses API's flat function tool, and a conversation's tool turns (an assistant turn that
called it, call ``call_1``, and the tool's answer)."""

from __future__ import annotations

import copy
from typing import Any

_CITY: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


DESCRIPTION = "The current weather in a city"


def _city(*, unit: bool = False, strict: bool = False) -> dict[str, Any]:
    parameters = copy.deepcopy(_CITY)
    if unit:
        parameters["properties"]["unit"] = {"enum": ["c", "f"]}
    if strict:
        parameters["additionalProperties"] = False
    return parameters


def weather_tool(description: str | None = None, *, unit: bool = False) -> dict[str, Any]:
    """The chat function tool ``get_weather``, whose one parameter is a required ``city``
    (``unit``: and an optional ``unit``, ``"c"`` or ``"f"``)."""
    described = {} if description is None else {"description": description}
    function = {"name": "get_weather", **described, "parameters": _city(unit=unit)}
    return {"type": "function", "function": function}


def weather_function(description: str | None = None, *, strict: bool = False) -> dict[str, Any]:
    """The Responses API's function tool ``get_weather`` (its name and parameters beside its
    type), whose one parameter is a required ``city``; ``strict``: no other property allowed
    and ``"strict": true``."""
    described = {} if description is None else {"description": description}
    tool = {
        "type": "function",
        "name": "get_weather",
        **described,
        "parameters": _city(strict=strict),
    }
    return (tool | {"strict": True}) if strict else tool


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
