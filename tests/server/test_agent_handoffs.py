"""The OpenAI Agents SDK with a handoff, run through a real ``frugal serve``: a triage agent
that hands weather questions to a specialist agent, which has a function tool.

On the API route (``x-frugal-route: api``) the fake API plays the model through its
``tool_script`` knob: the triage agent's request gets the handoff call, the specialist's first
request the tool call, and its second (with the tool's result) the text answer, so the run ends
with the specialist's final output within ``max_turns``. On the local route (``x-frugal-min-quality:
0``: every local answer is accepted) SmolLM2 is made to call a tool on each agent (``tool_choice``
required, which the local engine enforces with a grammar), as in test_agent_clients.py: the
triage agent's only tool is the handoff and the specialist's is ``get_weather``, at whose result
it stops; the run must end within ``max_turns`` (no ``MaxTurnsExceeded``), in the specialist,
with every turn answered locally and nothing sent to the API. (Left free to answer in text,
SmolLM2 runs on to the proxy's ``[local] default_max_tokens``, and the SDK raises on the
``incomplete`` answer that follows.)

The server, the tool and the ledger helpers are those of ``tests/server/test_agent_clients.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.server.test_agent_clients import (
    API_REPLY,
    async_client,
    responses_rows,
    wait_for_rows,
    weather,
)
from tests.server.test_serve import ACCEPT_ANY, Served, module_served

pytestmark = pytest.mark.serve

MAX_TURNS = 6
API_ROUTE = {"x-frugal-route": "api"}
PROMPT = "What is the weather in Paris?"

api = module_api(reply=API_REPLY)


# a generous local deadline: on a loaded machine a local turn must not fall to the API
served = module_served("handoffs", timeout_s=120)


@pytest.fixture(autouse=True)
def fresh_requests(api: FakeAPI) -> None:
    api.requests.clear()
    api.set(tool_script=[])


def run_triage(
    served: Served, headers: dict[str, str], **settings: Any
) -> tuple[Any, list[str], str]:
    """Run the triage agent on ``PROMPT`` with ``max_turns``; the result, the cities the tool was
    called with, and the name of the handoff's tool. ``settings`` go to both agents' model
    settings; with ``tool_choice="required"`` the specialist stops at its tool's first result."""
    import agents

    agents.set_tracing_disabled(True)  # its traces would be sent to OpenAI
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return weather(city)

    async def run() -> tuple[Any, str]:
        async with async_client(served) as client:
            model = agents.OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
            model_settings = agents.ModelSettings(extra_headers=headers, **settings)
            required = settings.get("tool_choice") == "required"
            specialist = agents.Agent(
                name="weather specialist",
                handoff_description="Answers questions about the weather.",
                instructions="Answer questions about the weather. Use get_weather.",
                model=model,
                tools=[get_weather],
                model_settings=model_settings,
                tool_use_behavior="stop_on_first_tool" if required else "run_llm_again",
            )
            handoff = agents.handoff(specialist)
            triage = agents.Agent(
                name="triage",
                instructions="Hand questions about the weather to the weather specialist.",
                model=model,
                handoffs=[handoff],
                model_settings=model_settings,
            )
            result = await agents.Runner.run(triage, PROMPT, max_turns=MAX_TURNS)
            return result, handoff.tool_name

    result, handoff_tool = asyncio.run(run())
    return result, asked, handoff_tool


def test_agents_sdk_handoff_then_specialist_tool_on_the_api_route(
    served: Served, api: FakeAPI
) -> None:
    api.set(
        tool_script=[
            {"name": "transfer_to_weather_specialist", "arguments": {}},
            {"name": "get_weather", "arguments": {"city": "Paris"}},
        ]
    )
    before = len(responses_rows(served))
    result, asked, handoff_tool = run_triage(served, API_ROUTE)
    assert handoff_tool == "transfer_to_weather_specialist"
    assert result.final_output == API_REPLY
    assert result.last_agent.name == "weather specialist"
    assert asked == ["Paris"]
    assert len(result.raw_responses) == 3  # handoff, tool call, answer: within MAX_TURNS

    # what the API was sent: the triage agent's tools, then the specialist's with the handoff's
    # call and output, then the specialist's with its tool's call and output
    assert [r.path for r in api.requests] == ["/v1/responses"] * 3
    triage, specialist, last = [r.body for r in api.requests]
    assert [t["name"] for t in triage["tools"]] == [handoff_tool]
    assert [t["name"] for t in specialist["tools"]] == ["get_weather"]
    assert [t["name"] for t in last["tools"]] == ["get_weather"]

    def calls(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [i for i in body["input"] if i.get("type") == "function_call"]

    def outputs(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [i for i in body["input"] if i.get("type") == "function_call_output"]

    assert calls(triage) == outputs(triage) == []
    assert [c["name"] for c in calls(specialist)] == [handoff_tool]
    assert [o["call_id"] for o in outputs(specialist)] == [calls(specialist)[0]["call_id"]]
    assert [c["name"] for c in calls(last)] == [handoff_tool, "get_weather"]
    handoff_call, tool_call = calls(last)
    assert json.loads(tool_call["arguments"]) == {"city": "Paris"}
    assert handoff_call["call_id"] != tool_call["call_id"]  # a new call id for each call
    assert outputs(last)[-1]["call_id"] == tool_call["call_id"]
    assert "sunny, 21 C" in str(outputs(last)[-1]["output"])
    assert api.tool_script == []  # the script was played to its end

    rows = wait_for_rows(served, before + 3)[before:]
    assert [(r["route"], r["status"]) for r in rows] == [("api", 200)] * 3


def test_agents_sdk_handoff_run_ends_within_max_turns_on_the_local_route(
    served: Served, api: FakeAPI
) -> None:
    import agents

    before = len(responses_rows(served))
    try:
        result, asked, _ = run_triage(served, ACCEPT_ANY, tool_choice="required")
    except agents.MaxTurnsExceeded as exc:  # the failure this test is about, said plainly
        pytest.fail(f"the local run did not end within max_turns={MAX_TURNS}: {exc}")
    turns = len(result.raw_responses)
    print(f"local handoff run: {turns} turns, last agent {result.last_agent.name!r}, {asked=}")
    assert turns == 2  # the handoff, then the specialist's tool call
    assert result.last_agent.name == "weather specialist"
    assert len(asked) == 1 and result.final_output == weather(asked[0])
    assert api.requests == []  # every turn was answered locally
    rows = wait_for_rows(served, before + turns)[before:]
    assert [(r["route"], r["status"]) for r in rows] == [("local", 200)] * turns
