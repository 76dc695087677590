"""Several tool calls in one local answer: the plan, the grammar, the parser, and the real model.

The parser tests feed :func:`proxy.engine.tools.to_message` text in the form the grammar makes
the engine write (one JSON object per call, one per line); the model tests run the real SmolLM2,
greedy, through :func:`proxy.engine.tasks.chat` with the real quality gate.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

import quality
from proxy.engine import grammar, tasks, tools
from proxy.engine.generate import LocalModel
from tests.tool_turns import DESCRIPTION, weather_tool

WEATHER = weather_tool(DESCRIPTION)
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TWO_CITIES = (
    "Get the weather in Paris and the weather in Rome: call get_weather twice, once for each city."
)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": TWO_CITIES}],
        "tools": [WEATHER, TIME],
        **extra,
    }


def line(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments})


PARIS = line("get_weather", {"city": "Paris"})
ROME = line("get_weather", {"city": "Rome"})


# -- the plan and the grammar ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "most"),
    [
        ({}, tools.MAX_CALLS),
        ({"parallel_tool_calls": True}, tools.MAX_CALLS),
        ({"tool_choice": "required"}, tools.MAX_CALLS),
        ({"parallel_tool_calls": False}, 1),
        ({"tool_choice": "required", "parallel_tool_calls": False}, 1),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, 1),
    ],
)
def test_an_answer_may_make_several_calls_unless_parallel_is_false_or_a_function_is_named(
    extra: dict[str, Any], most: int
) -> None:
    plan = tools.call_plan(body(**extra))
    assert plan is not None and plan.most == most
    text = grammar.gbnf_for(body(**extra))
    assert text is not None
    calls_rule = f'calls ::= call ("\\n" call){{0,{tools.MAX_CALLS - 1}}}'
    assert (calls_rule in text) == (most > 1)
    root = next(r for r in text.splitlines() if r.startswith("root ::= "))
    optional = extra.get("tool_choice") is None
    first = "calls" if most > 1 else "call"
    assert root == (f"root ::= {first} | text" if optional else f"root ::= {first}")


def test_deprecated_functions_allow_one_call() -> None:
    legacy = {"messages": [], "functions": [WEATHER["function"]]}
    plan = tools.call_plan(legacy)
    assert plan is not None and plan.legacy and plan.most == 1
    message, is_call = tools.to_message(PARIS + "\n" + ROME, plan)
    assert not is_call and message["content"] == PARIS + "\n" + ROME
    message, is_call = tools.to_message(PARIS, plan)
    assert is_call and message["function_call"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }


def test_the_prompt_says_how_to_make_several_calls_only_when_they_are_allowed() -> None:
    several = tools.prompt_messages(body())[0]["content"]
    one = tools.prompt_messages(body(parallel_tool_calls=False))[0]["content"]
    assert "one JSON object per line" in several
    assert "per line" not in one


def test_the_grammar_and_its_size_bound_stay_bounded_with_several_calls() -> None:
    from proxy.engine import grammar_size

    for extra in ({}, {"tool_choice": "required"}, {"parallel_tool_calls": False}):
        spec = grammar.spec_for(body(**extra))
        assert spec is not None
        text = grammar.gbnf_for(body(**extra))
        assert text is not None
        sizer = grammar_size.Sizer()
        sizer.spec(json.loads(spec))
        assert len(text) <= sizer.chars
        assert text.count("\n") + 1 <= sizer.rules


# -- the parser --------------------------------------------------------------------------------


def test_calls_one_per_line_become_tool_calls_each_with_its_own_id() -> None:
    plan = tools.call_plan(body())
    text = "\n".join([PARIS, ROME, line("get_time", {})]) + " "
    message, is_call = tools.to_message(text, plan)
    assert is_call and message["content"] is None
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
        {},
    ]
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == 3 and all(i.startswith("call_") for i in ids)
    assert all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize(
    ("text", "extra"),
    [
        (PARIS + "\n" + ROME, {"parallel_tool_calls": False}),  # one call at most
        ("\n".join(line("get_time", {"n": i}) for i in range(tools.MAX_CALLS + 1)), {}),  # bound
        (PARIS + '\n{"name": "get_weather", "argum', {}),  # the second call cut off
        (PARIS + "\nThat is all.", {}),  # prose after the call
        (PARIS + "\n" + line("get_news", {}), {}),  # a function the request does not have
        (PARIS + '\n{"name": "get_weather"}', {}),  # no arguments
        (PARIS + "\n[1]", {}),
    ],
)
def test_text_that_is_not_wholly_allowed_calls_stays_text(text: str, extra: dict[str, Any]) -> None:
    message, is_call = tools.to_message(text, tools.call_plan(body(**extra)))
    assert not is_call
    assert message == {"role": "assistant", "content": text, "refusal": None}


def test_a_call_repeated_in_one_answer_is_made_once() -> None:
    paris_in_c = line("get_weather", {"city": "Paris", "unit": "c"})
    text = "\n".join(
        [PARIS, ROME, PARIS, paris_in_c, ' {"arguments": {"city": "Rome"}, "name": "get_weather"}']
    )
    message, is_call = tools.to_message(text, tools.call_plan(body()))
    assert is_call
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"city": "Paris"},
        {"city": "Rome"},
        {"city": "Paris", "unit": "c"},
    ]


@pytest.mark.parametrize(
    ("text", "repeated"),
    [
        (PARIS + "\n" + PARIS, True),
        (PARIS + "\n" + ROME + "\n" + PARIS + " ", True),
        (PARIS + "\n" + ROME, False),
        (PARIS + "\n" + PARIS[:-1], False),  # not complete yet: it may still differ
        (PARIS, False),
        ("The weather is {fine}", False),
    ],
)
def test_the_engine_is_told_when_the_newest_call_repeats_an_earlier_one(
    text: str, repeated: bool
) -> None:
    assert tools.repeats(text) is repeated


def test_as_many_calls_as_the_bound_are_calls() -> None:
    text = "\n".join(line("get_weather", {"city": f"City {i}"}) for i in range(tools.MAX_CALLS))
    message, is_call = tools.to_message(text, tools.call_plan(body()))
    assert is_call and len(message["tool_calls"]) == tools.MAX_CALLS
    assert len({c["id"] for c in message["tool_calls"]}) == tools.MAX_CALLS


# -- the real model ----------------------------------------------------------------------------


def gate(request: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    verdict = quality.score(request, completion)
    return {"value": verdict.value, "reasons": verdict.reasons}


def answer(model: LocalModel, request: dict[str, Any]) -> dict[str, Any]:
    return tasks.chat(model, request, tasks.Hooks(on_token=None, should_stop=None, score=gate))


def must_call(tool: dict[str, Any], question: str, *, max_tokens: int) -> dict[str, Any]:
    """A request with ``question`` whose answer must be a call of its one ``tool``."""
    asked = [{"role": "user", "content": question}]
    return body(messages=asked, tools=[tool], tool_choice="required", max_tokens=max_tokens)


def test_the_model_calls_get_weather_for_two_cities_in_one_answer(model: LocalModel) -> None:
    request = body(tool_choice="required", max_tokens=80)
    completion = answer(model, request)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    cities = [json.loads(c["function"]["arguments"]) for c in calls]
    assert cities == [{"city": "Paris"}, {"city": "Rome"}]
    for arguments in cities:
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert len({c["id"] for c in calls}) == 2
    # The gate checks each call against its tool's schema: none is a format failure.
    reasons = completion["frugal"]["quality"]["reasons"]
    assert not [r for r in reasons if r.startswith(("tool_", "json_", "schema_"))]


def test_with_parallel_tool_calls_false_the_same_request_makes_one_call(
    model: LocalModel,
) -> None:
    completion = answer(
        model, body(tool_choice="required", max_tokens=80, parallel_tool_calls=False)
    )
    choice = completion["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "tool_calls"


def test_a_model_that_repeats_its_call_is_stopped_at_the_repeat(model: LocalModel) -> None:
    """With this schema the greedy SmolLM2 writes the same call again instead of ending."""
    weather = {
        **WEATHER,
        "function": {
            **WEATHER["function"],
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
    completion = answer(model, must_call(weather, "What is the weather in Paris?", max_tokens=200))
    assert completion["frugal"]["stop_cause"] == "repeated_call"
    assert completion["usage"]["completion_tokens"] < 80  # two calls, not eight
    choice = completion["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["city"] == "Paris"
    assert choice["finish_reason"] == "tool_calls"
    assert "truncated" not in completion["frugal"]["quality"]["reasons"]


# -- a call cut off by max_tokens (issue 42) ---------------------------------------------------


def cut_plan(*functions: dict[str, Any], **extra: Any) -> tools.CallPlan:
    plan = tools.call_plan(body(tools=list(functions or (WEATHER, TIME)), **extra))
    assert plan is not None
    return plan


@pytest.mark.parametrize(
    ("text", "arguments"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Par', '{"city": "Par'),
        ('{ "name": "get_weather", "arguments": ', ""),
        ('{ "name": "get_weather", "argu', ""),
        ('{ "name": "get_w', ""),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}', '{"city": "Paris"}'),
    ],
)
def test_a_call_cut_by_max_tokens_is_a_call_with_its_arguments_as_far_as_they_came(
    text: str, arguments: str
) -> None:
    message, is_call = tools.to_message(text, cut_plan(), cut=True)
    assert is_call and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": arguments}
    assert call["id"].startswith("call_")
    # Without the cut (a stop of the model's own), the same text is not a call: it stays text.
    assert tools.to_message(text, cut_plan()) == (
        {"role": "assistant", "content": text, "refusal": None},
        False,
    )


@pytest.mark.parametrize("text", ['{ "name": "get_', "{", '{"na'])
def test_a_cut_call_that_could_be_either_tool_gives_no_grammar_text(text: str) -> None:
    message, is_call = tools.to_message(text, cut_plan(), cut=True)
    assert (message["content"], message.get("tool_calls"), is_call) == ("", None, False)
    # With one tool, the grammar could only have been calling it.
    message, is_call = tools.to_message(text, cut_plan(WEATHER), cut=True)
    assert is_call and message["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": "",
    }


def test_several_calls_cut_by_max_tokens_keep_the_whole_ones() -> None:
    text = PARIS + '\n{"name": "get_weather", "arguments": {"ci'
    message, is_call = tools.to_message(text, cut_plan(), cut=True)
    assert is_call
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [
        json.dumps({"city": "Paris"}),
        '{"ci',
    ]
    ambiguous = PARIS + '\n{"name": "get_'
    message, is_call = tools.to_message(ambiguous, cut_plan(), cut=True)
    assert is_call and len(message["tool_calls"]) == 1


def test_a_deprecated_function_call_cut_by_max_tokens_is_a_cut_function_call() -> None:
    plan = tools.call_plan({"messages": [], "functions": [WEATHER["function"]]})
    assert plan is not None
    message, is_call = tools.to_message('{"name": "get_weather", "arguments": {"ci', plan, cut=True)
    assert is_call and message["function_call"] == {"name": "get_weather", "arguments": '{"ci'}


def test_a_required_call_cut_by_max_tokens_reaches_the_client_as_a_cut_call(
    model: LocalModel,
) -> None:
    """Issue 42, finding 3: ``max_tokens: 8`` used to hand out '{ "name": "get_' as text."""
    completion = answer(model, must_call(WEATHER, "Weather in Paris?", max_tokens=8))
    choice = completion["choices"][0]
    print(choice["message"])
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert "{" not in call["function"]["name"]
    quality_ = completion["frugal"]["quality"]
    assert "tool_call_cut" in quality_["reasons"] and quality_["value"] <= 0.1


# -- a call whose result is in (issue 42) ------------------------------------------------------


def agent_turn(**extra: Any) -> dict[str, Any]:
    from tests.tool_turns import weather_turns

    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            *weather_turns("18C and sunny"),
        ],
        "tools": [WEATHER],
        "max_tokens": 60,
        **extra,
    }


def test_a_call_whose_result_is_in_is_not_made_again_the_model_answers_in_text(
    model: LocalModel,
) -> None:
    """Issue 42, finding 4: greedy SmolLM2 calls get_weather(Paris) again after its result; the
    engine asks it for text instead, so an agent loop ends on the local route too."""
    repeated = answer(model, agent_turn(tool_choice="required"))
    [again] = repeated["choices"][0]["message"]["tool_calls"]
    assert json.loads(again["function"]["arguments"]) == {"city": "Paris"}  # what it would do
    assert "tool_call_repeated" in repeated["frugal"]["quality"]["reasons"]
    completion = answer(model, agent_turn())
    choice = completion["choices"][0]
    print(choice["message"], completion["frugal"]["quality"])
    assert completion["frugal"]["answered_call_dropped"] is True
    assert "tool_calls" not in choice["message"]
    content = choice["message"]["content"]
    assert content and not content.lstrip().startswith("{")
    assert choice["finish_reason"] in ("stop", "length")
    # The usage counts the dropped call's tokens besides the text's.
    assert completion["usage"]["completion_tokens"] > len(choice["logprobs"]["content"])
