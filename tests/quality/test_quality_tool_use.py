"""The gate on agent turns (``quality/tool_use.py``, ``quality/turns.py``, and the cut call in
``quality/format.py``): an answer after a tool's result must use it, never repeat the call whose
result is in, and a call cut off by ``max_tokens`` is never a usable call.

The conversations are the ones agent frameworks send: the user's question, the assistant's call
of ``get_weather``, the tool's result; the answers are written by hand in the shapes the local
engine returns them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from quality import score
from quality._view import view_of
from quality.format import format_compliance
from quality.tool_use import tool_use
from quality.turns import answered_calls, call_key, is_error
from tests.tool_turns import weather_tool, weather_turns

QUESTION = {"role": "user", "content": "Weather in Paris?"}


def agent_request(*turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [QUESTION, *turns],
        "tools": [weather_tool()],
        **extra,
    }


def call(city: str, call_id: str = "call_9") -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def calls(*tool_calls: dict[str, Any], finish_reason: str = "tool_calls") -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
    }


def text(content: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
    }


# -- the call whose result is in --------------------------------------------------------------


def test_the_call_whose_result_just_arrived_made_again_is_a_hard_fault() -> None:
    """Issue 42's transcript: the gate accepted this answer at 0.630."""
    request = agent_request(*weather_turns("18C and sunny"))
    signal = tool_use(view_of(request, calls(call("Paris"))))
    assert signal.applied and signal.hard == ("tool_call_repeated",)
    verdict = score(request, calls(call("Paris")))
    print(f"repeated call: {verdict.value:.3f} {verdict.reasons}")
    assert "tool_call_repeated" in verdict.reasons
    assert verdict.value <= 0.1  # the hard cap, below any threshold


def test_the_same_arguments_written_otherwise_are_the_same_call() -> None:
    request = agent_request(*weather_turns("18C and sunny", arguments='{"city":"Paris"}'))
    spaced = call("Paris")
    spaced["function"]["arguments"] = '{ "city" :  "Paris" }'
    assert tool_use(view_of(request, calls(spaced))).hard == ("tool_call_repeated",)


def test_a_call_with_new_arguments_or_one_of_several_repeated_is_judged_so() -> None:
    request = agent_request(*weather_turns("18C and sunny"))
    assert tool_use(view_of(request, calls(call("Rome")))).hard == ()
    both = calls(call("Rome", "call_a"), call("Paris", "call_b"))
    assert tool_use(view_of(request, both)).hard == ("tool_call_repeated",)


@pytest.mark.parametrize(
    "result",
    [
        "Error: the weather service timed out",
        '{"error": "upstream unavailable"}',
        '{"ok": false, "detail": "try again"}',
        "Traceback (most recent call last): ...",
    ],
)
def test_calling_again_after_an_error_is_no_fault(result: str) -> None:
    assert is_error(result)
    request = agent_request(*weather_turns(result))
    assert answered_calls(request["messages"]) == frozenset()
    assert tool_use(view_of(request, calls(call("Paris")))).hard == ()


def test_a_call_answered_before_the_users_last_message_may_be_made_again() -> None:
    """A new question ("and now?") may rightly ask for the same call again."""
    again = {"role": "user", "content": "And now, is it still sunny?"}
    request = agent_request(*weather_turns("18C and sunny"), text_turn("It is 18C."), again)
    assert answered_calls(request["messages"]) == frozenset()
    assert tool_use(view_of(request, calls(call("Paris")))).hard == ()


def text_turn(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def test_answered_calls_reads_tool_and_deprecated_function_results() -> None:
    messages = [
        QUESTION,
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"role": "function", "name": "get_weather", "content": "18C and sunny"},
    ]
    assert answered_calls(messages) == {call_key("get_weather", {"city": "Paris"})}
    pending = [QUESTION, weather_turns("x")[0]]  # called, no result yet
    assert answered_calls(pending) == frozenset()


# -- a text answer after the result -----------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "It is 18°C and sunny in Paris.",
        "Sunny, 18 degrees.",
        "The weather in Paris is sunny today.",
    ],
)
def test_an_answer_that_uses_the_result_passes(answer: str) -> None:
    request = agent_request(*weather_turns("18C and sunny"))
    assert tool_use(view_of(request, text(answer))).hard == ()


def test_an_answer_that_ignores_the_result_is_a_hard_fault() -> None:
    request = agent_request(*weather_turns("18C and sunny"))
    answer = text("I'm sorry, I cannot check the weather for you.")
    assert tool_use(view_of(request, answer)).hard == ("tool_result_unused",)
    assert score(request, answer).value <= 0.1


def test_after_an_error_a_text_answer_need_not_quote_it() -> None:
    request = agent_request(*weather_turns("Error: service down"))
    answer = text("I could not get the weather right now; please try later.")
    assert tool_use(view_of(request, answer)).hard == ()


def test_a_conversation_without_tool_turns_is_not_judged_here() -> None:
    request = {"model": "m", "messages": [QUESTION], "tools": [weather_tool()]}
    assert not tool_use(view_of(request, calls(call("Paris")))).applied
    assert not tool_use(view_of(request, text("Sunny."))).applied


# -- a call cut off by max_tokens -------------------------------------------------------------


@pytest.mark.parametrize("arguments", ['{"city": "Par', "", '{"city": "Paris"}'])
def test_a_call_cut_by_max_tokens_is_a_hard_fault_even_when_its_arguments_parse(
    arguments: str,
) -> None:
    """Issue 42: a cut call is never accepted on the default route."""
    request = {"model": "m", "messages": [QUESTION], "tools": [weather_tool()], "max_tokens": 8}
    cut = call("Paris")
    cut["function"]["arguments"] = arguments
    completion = calls(cut, finish_reason="length")
    assert "tool_call_cut" in format_compliance(view_of(request, completion)).hard
    assert score(request, completion).value <= 0.1
    whole = calls(call("Paris"))
    assert format_compliance(view_of(request, whole)).hard == ()
