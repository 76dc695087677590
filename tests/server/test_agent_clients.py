"""Agents built on OpenAI's Responses API, run through a real ``frugal serve`` as their users
run them: only ``base_url`` changes.

- the OpenAI Agents SDK (``openai-agents``): ``OpenAIResponsesModel``, its default model;
- pydantic-ai's ``OpenAIResponsesModel``;
- LangChain's ``ChatOpenAI(use_responses_api=True)`` with a bound tool, the tool loop by hand
  (LangChain's own agent loop lives in LangGraph, which is not installed).

Each agent has one function tool. On the API route (the gate rejects every local answer) the
fake API decides to call the tool (its ``tool_call`` knob), the agent runs it and sends the result
back, and the fake API answers in text: the second request must carry the call and its output. On
the local route SmolLM2 is made to call the tool (``tool_choice`` required, the gate lets it
through) and the agent stops at the tool's result.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import openai
import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.load_factor import wait_until
from tests.server.test_serve import ACCEPT_ANY, REJECT_ALL, Served, module_served

pytestmark = pytest.mark.serve

API_REPLY = "It is sunny in Paris today."
WEATHER_IN = {"Paris": "sunny, 21 C"}


api = module_api(reply=API_REPLY, tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})


# a generous local deadline: on a loaded machine a local turn must not fall to the API
served = module_served("agents", timeout_s=120)


@pytest.fixture(autouse=True)
def fresh_requests(api: FakeAPI) -> None:
    api.requests.clear()


def weather(city: str) -> str:
    """The tool every agent gets: a fixed table, so the result can be asserted."""
    return WEATHER_IN.get(city, f"no weather known for {city}")


def async_client(served: Served) -> openai.AsyncOpenAI:
    sync = served.client()
    return openai.AsyncOpenAI(base_url=str(sync.base_url), api_key=sync.api_key, max_retries=0)


def run_agent(served: Served, headers: dict[str, str], prompt: str, **settings: Any) -> Any:
    """Run the Agents SDK's agent in a loop of its own, its client closed before the loop is."""
    import agents

    async def run() -> Any:
        async with async_client(served) as client:
            agent = agents_sdk_agent(client, headers, **settings)
            if settings.get("tool_choice") == "required":
                agent.tool_use_behavior = "stop_on_first_tool"
            return await agents.Runner.run(agent, prompt)

    return asyncio.run(run())


def responses_rows(served: Served) -> list[dict[str, Any]]:
    conn = sqlite3.connect(served.db)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT endpoint, route, reason, status FROM requests WHERE endpoint = 'responses'"
            " ORDER BY id"
        ).fetchall()
    except sqlite3.OperationalError:
        rows = []
    finally:
        conn.close()
    return [dict(row) for row in rows]


def wait_for_rows(served: Served, count: int) -> list[dict[str, Any]]:
    return wait_until(
        lambda: rows if len(rows := responses_rows(served)) >= count else None,
        f"{count} responses rows",
    )


def assert_tool_round_trip(api: FakeAPI) -> None:
    """The API was asked twice: first with the tool offered, then with the call and the tool's
    result in the conversation: on the upstream's own /v1/responses (the default fallback) as a
    ``function_call`` and a ``function_call_output`` item, translated to chat (``[fallback]
    responses = "translate"``) as an assistant tool call and a tool message."""
    paths = {r.path for r in api.requests}
    if paths == {"/v1/responses"}:
        first, second = [r.body for r in api.requests]
        assert [t["name"] for t in first["tools"]] == ["get_weather"]
        assert first["input"][-1]["role"] == "user"
        assert first["store"] is False and second["store"] is False
        call = next(i for i in second["input"] if i.get("type") == "function_call")
        assert call["name"] == "get_weather"
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        output = second["input"][-1]
        assert output["type"] == "function_call_output"
        assert output["call_id"] == call["call_id"]
        assert "sunny, 21 C" in str(output["output"])
        return
    chats = [r.body for r in api.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == 2, [r.path for r in api.requests]
    first, second = chats
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather"]
    assert first["messages"][-1]["role"] == "user"
    call = next(m for m in second["messages"] if m.get("tool_calls"))
    assert call["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    result = second["messages"][-1]
    assert result["role"] == "tool"
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert "sunny, 21 C" in str(result["content"])


# -- the OpenAI Agents SDK -----------------------------------------------------------------------


def agents_sdk_agent(client: openai.AsyncOpenAI, headers: dict[str, str], **settings: Any) -> Any:
    import agents

    agents.set_tracing_disabled(True)  # its traces would be sent to OpenAI

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return weather(city)

    model = agents.OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
    return agents.Agent(
        name="weather",
        instructions="Answer questions about the weather. Use get_weather.",
        model=model,
        tools=[get_weather],
        model_settings=agents.ModelSettings(extra_headers=headers, **settings),
    )


def assert_paid_round_trip(served: Served, api: FakeAPI, before: int) -> None:
    """The tool round trip went to the API (``assert_tool_round_trip``) and the ledger has its
    two turns, after the ``before`` rows it had, as paid answers."""
    assert_tool_round_trip(api)
    rows = wait_for_rows(served, before + 2)[before:]
    assert [(r["route"], r["status"]) for r in rows] == [("api", 200), ("api", 200)]


def test_openai_agents_sdk_runs_a_tool_round_trip_on_the_api_route(
    served: Served, api: FakeAPI
) -> None:
    before = len(responses_rows(served))
    result = run_agent(served, REJECT_ALL, "What is the weather in Paris?")
    assert result.final_output == API_REPLY
    assert_paid_round_trip(served, api, before)


def test_openai_agents_sdk_runs_its_tool_from_a_local_answer(served: Served, api: FakeAPI) -> None:
    before = len(responses_rows(served))
    # tool_choice required (the SDK resets it after the call) and a stop at the tool's result
    result = run_agent(served, ACCEPT_ANY, "What is the weather in Paris?", tool_choice="required")
    calls = [item for item in result.new_items if item.type == "tool_call_item"]
    assert calls and calls[0].raw_item.name == "get_weather"
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert result.final_output == outputs[0].output
    assert api.requests == []  # nothing paid: the model's call and the stop were both local
    rows = wait_for_rows(served, before + 1)[before:]
    assert [(r["route"], r["status"]) for r in rows] == [("local", 200)]


@pytest.mark.parametrize("route", ["default", "local"])
def test_openai_agents_sdk_agent_loop_ends_within_its_turn_limit(
    served: Served, api: FakeAPI, route: str
) -> None:
    """Issue 42: after the tool's result SmolLM2 made the same call again, and the run ended in
    ``MaxTurnsExceeded``. Now the local engine answers the result in text (the local route, the
    client's own choice of no gate), or the gate sends an answer it rejects to the API, whose
    model answers in text (the default route): the run ends within its turns either way."""
    import agents

    headers = {"x-frugal-route": "local"} if route == "local" else {}
    before = len(responses_rows(served))

    async def run() -> Any:
        async with async_client(served) as client:
            agent = agents_sdk_agent(client, headers, tool_choice="required")
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)

    result = asyncio.run(run())
    # every turn's row is written before the next test counts the rows it starts with
    wait_for_rows(served, before + len(result.raw_responses))
    calls = [item for item in result.new_items if item.type == "tool_call_item"]
    print(route, [(c.raw_item.name, c.raw_item.arguments) for c in calls], result.final_output)
    assert calls and calls[0].raw_item.name == "get_weather"
    assert isinstance(result.final_output, str) and result.final_output
    assert not result.final_output.lstrip().startswith("{")
    made = [(c.raw_item.name, json.loads(c.raw_item.arguments)) for c in calls]
    assert len(made) == len({json.dumps(m, sort_keys=True) for m in made})  # none made twice
    if route == "local":
        assert api.requests == []


# -- pydantic-ai ---------------------------------------------------------------------------------


def pydantic_ai_agent(client: openai.AsyncOpenAI) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(openai_client=client)
    agent = Agent(
        OpenAIResponsesModel("gpt-4o-mini", provider=provider),
        instructions="Answer questions about the weather. Use get_weather.",
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return weather(city)

    return agent


def run_pydantic_ai(served: Served, prompt: str, settings: dict[str, Any]) -> Any:
    async def run() -> Any:
        async with async_client(served) as client:
            return await pydantic_ai_agent(client).run(prompt, model_settings=settings)

    return asyncio.run(run())


def test_pydantic_ai_runs_a_tool_round_trip_on_the_api_route(served: Served, api: FakeAPI) -> None:
    before = len(responses_rows(served))
    result = run_pydantic_ai(served, "What is the weather in Paris?", {"extra_headers": REJECT_ALL})
    assert result.output == API_REPLY
    assert_paid_round_trip(served, api, before)


def test_pydantic_ai_gets_a_local_answer_through_the_responses_model(
    served: Served, api: FakeAPI
) -> None:
    before = len(responses_rows(served))
    result = run_pydantic_ai(served, "Say hello.", {"extra_headers": ACCEPT_ANY, "max_tokens": 16})
    assert isinstance(result.output, str)
    # a local answer that called the tool is followed by a second turn; none reached the API
    turns = [m for m in result.all_messages() if m.kind == "response"]
    rows = wait_for_rows(served, before + len(turns))[before:]
    assert [r["route"] for r in rows] == ["local"] * len(turns)
    assert api.requests == []


# -- LangChain -----------------------------------------------------------------------------------


def langchain_with_tool(served: Served, headers: dict[str, str], **bind: Any) -> tuple[Any, Any]:
    """The ``get_weather`` tool, and LangChain's ChatOpenAI on the Responses API with it bound."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return weather(city)

    sync = served.client()
    chat = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=str(sync.base_url),
        api_key=sync.api_key,
        use_responses_api=True,
        default_headers=headers,
        max_retries=0,
    )
    return get_weather, chat.bind_tools([get_weather], **bind)


def test_langchain_responses_api_tool_loop_on_the_api_route(served: Served, api: FakeAPI) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    get_weather, chat = langchain_with_tool(served, REJECT_ALL)
    before = len(responses_rows(served))
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = chat.invoke(messages)
    assert [c["name"] for c in first.tool_calls] == ["get_weather"]
    messages.append(first)
    for call in first.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = chat.invoke(messages)
    assert final.text == API_REPLY
    assert_paid_round_trip(served, api, before)


def test_langchain_responses_api_gets_a_named_tool_call_from_the_local_model(
    served: Served, api: FakeAPI
) -> None:
    _, chat = langchain_with_tool(served, ACCEPT_ANY, tool_choice="get_weather")
    before = len(responses_rows(served))
    message = chat.invoke("What is the weather in Paris?")
    assert [c["name"] for c in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"].get("city"), str)
    assert api.requests == []
    rows = wait_for_rows(served, before + 1)[before:]
    assert [(r["route"], r["status"]) for r in rows] == [("local", 200)]
