"""Real clients against a real ``frugal serve`` on a loopback port.

- the official ``openai`` Python SDK, sync and async: streaming, ``with_raw_response`` headers,
  JSON mode (``.parse`` with a pydantic model), tools and tool results, logprobs, ``n=2``,
  ``include_usage``, legacy completions, embeddings, models, and errors raised as the SDK's own
  exception classes;
- the official ``openai`` npm package on Node (installed from the npm registry into a temp dir);
- LangChain's ``ChatOpenAI``: invoke and stream.

Local answers are let through the gate (``x-frugal-min-quality: 0``) where a test is about their
shape; SmolLM2-135M is tiny. The fake API plays the provider.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.load_factor import scaled
from tests.server.test_serve import ACCEPT_ANY, REJECT_ALL, Served, serving
from tests.tool_turns import weather_tool

pytestmark = pytest.mark.serve

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
API_REPLY = "The capital of France is Paris."
WEATHER: Any = weather_tool("The current weather in a city")
JS = Path(__file__).parent / "js"


class Capital(pydantic.BaseModel):
    country: str
    capital: str


api = module_api(reply=API_REPLY)


@pytest.fixture(scope="module")
def served(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("compat"), api) as server:
        yield server


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return served.client()


def ledger_row(served: Served, request_id: str) -> dict[str, Any]:
    for _ in range(100):
        conn = sqlite3.connect(served.db)
        conn.row_factory = sqlite3.Row
        try:
            row = conn.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            conn.close()
        if row is not None:
            return dict(row)
        time.sleep(0.05)
    raise AssertionError(f"no ledger row for {request_id}")


# -- the Python SDK ----------------------------------------------------------------------------


def test_raw_response_headers_and_the_request_id_in_log_and_ledger(
    client: openai.OpenAI, served: Served
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=16,
        extra_headers={**ACCEPT_ANY, "x-request-id": "compat-req-1"},
    )
    assert raw.headers["x-request-id"] == "compat-req-1"
    assert raw.headers["x-frugal-route"] == "local"
    assert raw.headers["x-frugal-reason"] == "accepted"
    assert 0 <= float(raw.headers["x-frugal-quality"]) <= 1
    completion = raw.parse()
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    assert completion.choices[0].message.content
    row = ledger_row(served, "compat-req-1")
    assert (row["endpoint"], row["route"]) == ("chat.completions", "local")
    lines = [json.loads(line) for line in served.log.read_text().splitlines() if "{" in line[:1]]
    assert any(e.get("request_id") == "compat-req-1" and e.get("event") == "request" for e in lines)


def test_streaming_with_usage_and_logprobs(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
        extra_headers=ACCEPT_ANY,
    )
    text, usage, entries = "", None, []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                entries += chunk.choices[0].logprobs.content
        if chunk.usage is not None:
            usage = chunk.usage
    assert text.strip()
    assert usage is not None and usage.completion_tokens == len(entries)
    assert "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_logprobs_and_n_in_json(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=8,
        n=2,
        logprobs=True,
        top_logprobs=3,
        extra_headers=ACCEPT_ANY,
    )
    assert [c.index for c in completion.choices] == [0, 1]
    for choice in completion.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in choice.logprobs.content)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == sum(
        len(c.logprobs.content or []) for c in completion.choices if c.logprobs
    )


def test_json_mode_with_a_pydantic_model(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.parse(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Name the capital of France, as JSON."}],
        response_format=Capital,
        max_tokens=40,
        extra_headers=ACCEPT_ANY,
    )
    assert raw.headers["x-frugal-route"] == "local"
    parsed = raw.parse().choices[0].message.parsed
    assert isinstance(parsed, Capital)


def test_tools_and_tool_results(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=40,
        extra_headers=ACCEPT_ANY,
    )
    assert raw.headers["x-frugal-route"] == "local"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C and sunny"},
    ]
    follow_up = client.chat.completions.create(
        model="local", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=24
    )
    assert follow_up.choices[0].message.content
    assert not follow_up.choices[0].message.tool_calls


def test_streamed_tool_call_through_the_sdk_helper(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="local",
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)


async def test_async_client_plain_and_streamed(served: Served) -> None:
    async with openai.AsyncOpenAI(
        base_url=served.base + "/v1", api_key="sk-unused", max_retries=0
    ) as aclient:
        completion = await aclient.chat.completions.create(
            model="gpt-4o-mini",
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=12,
            extra_headers=ACCEPT_ANY,
        )
        stream = await aclient.chat.completions.create(
            model="gpt-4o-mini",
            messages=QUESTION,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=REJECT_ALL,
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
    assert completion.choices[0].message.content
    assert text.split() == API_REPLY.split()  # rejected locally: the API's stream
    assert usage is not None and usage.completion_tokens == len(API_REPLY.split())


def test_legacy_completions_embeddings_and_models(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="gpt-3.5-turbo-instruct",
        prompt="The capital of France is",
        max_tokens=6,
        logprobs=1,
        extra_headers=ACCEPT_ANY,
    )
    assert raw.headers["x-frugal-route"] == "local"
    completion = raw.parse()
    assert completion.choices[0].text
    assert completion.choices[0].logprobs is not None
    assert len(completion.choices[0].logprobs.tokens or []) == completion.usage.completion_tokens  # type: ignore[union-attr]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="gpt-3.5-turbo-instruct",
            prompt="One, two,",
            max_tokens=4,
            stream=True,
            extra_headers=ACCEPT_ANY,
        )
        if c.choices
    )
    assert streamed
    # The SDK asks for base64 and decodes it back to floats.
    embeddings = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(embeddings.data) == 2 and len(embeddings.data[0].embedding) == 8
    assert [m.id for m in client.models.list()][0] == "local"


def test_errors_are_the_sdks_own_exceptions(client: openai.OpenAI, api: FakeAPI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="gpt-4o-mini", messages=[], max_tokens=4)
    assert bad.value.param == "messages"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(
            model="local",
            messages=QUESTION,  # type: ignore[arg-type]
            web_search_options={},
        )
    assert unsupported.value.code == "unsupported_locally"
    with pytest.raises(openai.NotFoundError):
        client.get("/nothing-here", cast_to=object)
    api.set(fail_status=404, error_message="The model 'gpt-9' does not exist")
    try:
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(
                model="gpt-9",
                messages=QUESTION,  # type: ignore[arg-type]
                extra_headers={"x-frugal-route": "api"},
            )
        assert "gpt-9" in missing.value.message
        api.set(fail_status=500)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=QUESTION,  # type: ignore[arg-type]
                extra_headers={"x-frugal-route": "api"},
            )
        assert failed.value.status_code == 502
    finally:
        api.reset()


# -- other clients -----------------------------------------------------------------------------

NODE_OPENAI = "7.59.0"  # the official npm client, the newest release when this was written
NODE_MIN = 18


def npm_install(npm: str, root: Path, package: str, timeout_s: float) -> None:
    """``npm install`` of ``package`` (a pinned ``name@version``) into ``root``, given
    ``timeout_s`` (scaled to the machine's load); it must succeed."""
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--silent", package],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=scaled(timeout_s),
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def node_openai(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temp dir with the official `openai` npm package installed, and our script in it.

    The version is pinned, so that a new release cannot change what this test means overnight.
    It declares Node >= 22, but the calls chat.mjs makes ran the same on Node 18 (Debian 12's,
    which `./dev test` installs) and Node 20; older Node is refused here, with the reason."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the Node client test (apt-get install nodejs npm)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    assert major >= NODE_MIN, f"the Node client test needs Node {NODE_MIN}+, found {version.stdout}"
    root = tmp_path_factory.mktemp("node")
    (root / "package.json").write_text('{"private": true, "type": "module"}')
    npm_install(npm, root, f"openai@{NODE_OPENAI}", timeout_s=300)
    for script in ("chat.mjs", "responses.mjs"):
        shutil.copy(JS / script, root / script)
    return root


def run_script(node_openai: Path, script: str, served: Served) -> Any:
    """Run one of our scripts with Node against ``served``; what it saw: its last line's JSON."""
    out = subprocess.run(
        ["node", script, served.base + "/v1"],
        cwd=node_openai,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_official_node_client_plain_and_streamed(served: Served, node_openai: Path) -> None:
    seen = run_script(node_openai, "chat.mjs", served)
    assert seen["route"] == "local", seen
    assert seen["content"] and seen["usage"]["completion_tokens"] > 0
    assert seen["streamed"].strip()
    assert seen["stream_usage"]["completion_tokens"] > 0
    assert seen["error"] == {"name": "BadRequestError", "status": 400, "param": "temperature"}


def test_official_node_client_on_the_responses_api(
    served: Served, node_openai: Path, api: FakeAPI
) -> None:
    """responses.create on the local route, then on the API route continuing it (the upstream's
    own /v1/responses is sent the earlier turn), responses.stream on the API route (the final
    text the joined deltas, ordered sequence numbers), and a retrieve of the stored answer."""
    sent_before = api.count
    reply = api.reply  # what the API answers now (another test may have reset it)
    seen = run_script(node_openai, "responses.mjs", served)
    assert seen["route"] == "local", seen
    assert seen["text"] and seen["usage"]["output_tokens"] > 0
    assert seen["followed_text"] == reply and seen["followed_previous"] == seen["local_id"]
    assert seen["deltas"] == seen["final_text"] == reply
    assert seen["sequence"] == list(range(len(seen["sequence"])))
    assert (seen["first"], seen["last"]) == ("response.created", "response.completed")
    assert seen["fetched_id"] == seen["final_id"] and seen["fetched_text"] == reply
    followed, streamed = [r.body for r in api.requests[sent_before:]]
    assert followed["store"] is False and streamed["store"] is False and streamed["stream"]
    assert [item["role"] for item in followed["input"]] == ["user", "assistant", "user"]
    assert followed["input"][1]["content"][0]["text"] == seen["text"]


def test_langchain_chat_openai_invoke_and_stream(served: Served) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=served.base + "/v1",
        api_key="sk-unused",  # type: ignore[arg-type]
        max_tokens=16,  # type: ignore[call-arg]
        max_retries=0,
        default_headers=ACCEPT_ANY,
    )
    reply = chat.invoke("What is the capital of France?")
    assert isinstance(reply.content, str) and reply.content
    assert reply.response_metadata.get("finish_reason") in ("stop", "length")
    pieces = [chunk.content for chunk in chat.stream("What is the capital of France?")]
    assert "".join(str(p) for p in pieces).strip()
