"""What reaches the upstream API: allow-listed parameters only, on the direct and litellm routes.

A body's routing or credential keys (``base_url``, ``api_key``, ``model_list``,
``mock_response``...) would let a client send the prompt and the provider's key to a host of its
choosing, or write a fake "paid" answer into the ledger. They are refused with a 400 naming them,
and never forwarded even when validation is skipped. The litellm checks run the real litellm
against the fake API, with a second listening socket standing in for the attacker's host.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import completion_create_params as chat_params

from proxy import config
from proxy.config import FallbackSettings
from proxy.engine.local_engine import LocalEngine
from proxy.errors import BadRequest
from proxy.protocol.forwarding import ROUTING_PARAMETERS, check_parameters, is_routing_parameter
from proxy.protocol.params import CHAT_PARAMETERS, COMPLETIONS_PARAMETERS, EMBEDDINGS_PARAMETERS
from proxy.protocol.validate import chat_request, completions_request, embeddings_request
from proxy.upstream.client import Upstream
from proxy.upstream.litellm_route import (
    LITELLM_OWN_KWARGS,
    LITELLM_PARAMETERS,
    LitellmRoute,
    import_litellm,
)
from tests.conftest import FAKE_KEY_ENV, settings_for
from tests.fake_api import FakeAPI
from tests.in_process import in_process
from tests.loopback import Listener
from tests.upstream.test_upstream import settings as upstream_settings

MSG = [{"role": "user", "content": "What is the capital of France?"}]
MAPPED = {"claude": "hosted_vllm/served-model"}
CANNED = "a canned answer nobody paid for"


@pytest.fixture
def evil() -> Iterator[Listener]:
    with Listener() as listener:
        yield listener


@pytest.fixture
def litellm_api(fake_api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    """The fake API as the base URL litellm's hosted_vllm provider reads from its variable."""
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", fake_api.url)
    return fake_api


def hostile(evil: Listener) -> dict[str, Any]:
    """Keys that would route a litellm call elsewhere, swap its key, or answer it from thin air."""
    return {
        "base_url": evil.url,
        "api_base": evil.url,
        "api_key": "sk-attacker",
        "model_list": [
            {"model_name": "claude", "litellm_params": {"model": "openai/x", "api_base": evil.url}}
        ],
        "fallbacks": [{"claude": ["openai/x"]}],
        "custom_llm_provider": "openai",
        "mock_response": CANNED,
        "extra_headers": {"x-evil": "1"},
        "num_retries": 5,
        "aws_region_name": "us-east-1",
        "vertex_project": "p",
        "litellm_logging_obj": None,
    }


def litellm_own_keywords() -> set[str]:
    """Every keyword the installed litellm takes that is its own rather than OpenAI's."""
    litellm = import_litellm()
    from litellm.types.utils import all_litellm_params

    sdk = set(typing.get_type_hints(chat_params.CompletionCreateParamsBase)) | set(
        typing.get_type_hints(chat_params.CompletionCreateParamsStreaming)
    )
    signature = set(inspect.signature(litellm.acompletion).parameters) | set(
        inspect.signature(litellm.completion).parameters
    )
    named = (signature | set(litellm.OPENAI_CHAT_COMPLETION_PARAMS)) - sdk - {"kwargs"}
    return named | set(all_litellm_params)


# -- the allow-lists ---------------------------------------------------------------------------


def test_litellm_is_never_handed_one_of_its_own_keywords_from_a_client() -> None:
    """Fails when an installed litellm starts reading a keyword that we would forward."""
    own = litellm_own_keywords()
    assert {"base_url", "api_base", "model_list", "mock_response", "metadata"} <= own  # real
    assert sorted(LITELLM_PARAMETERS & own) == []
    assert LITELLM_PARAMETERS <= set(CHAT_PARAMETERS)


def test_every_litellm_keyword_outside_openais_parameters_is_a_400_naming_it() -> None:
    for name in sorted(litellm_own_keywords() - set(CHAT_PARAMETERS)):
        with pytest.raises(BadRequest) as info:
            chat_request({"model": "claude", "messages": MSG, name: "x"})
        assert info.value.status == 400
        assert info.value.param == name
        assert info.value.code in ("unsupported_parameter", "unknown_parameter"), name


@pytest.mark.parametrize(
    "name",
    sorted(
        ROUTING_PARAMETERS
        | {"aws_access_key_id", "vertex_credentials", "azure_ad_token", "litellm_params"}
    ),
)
def test_routing_and_credential_fields_are_400s_naming_the_field(name: str) -> None:
    assert is_routing_parameter(name)
    for check, body in (
        (chat_request, {"model": "claude", "messages": MSG}),
        (completions_request, {"model": "claude", "prompt": "Hi"}),
        (embeddings_request, {"model": "claude", "input": "Hi"}),
    ):
        with pytest.raises(BadRequest) as info:
            check({**body, name: "https://evil.example/"})
        error = info.value.body()["error"]
        assert (error["param"], error["code"], error["type"]) == (
            name,
            "unsupported_parameter",
            "invalid_request_error",
        )
        assert info.value.status == 400


def test_a_routing_field_is_named_before_other_unknown_keys() -> None:
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "m", "messages": MSG, "top_k": 3, "base_url": "http://x/"})
    assert info.value.param == "base_url"


@pytest.mark.parametrize(
    ("table", "body"),
    [
        (CHAT_PARAMETERS, {"model": "m", "messages": MSG}),
        (COMPLETIONS_PARAMETERS, {"model": "m", "prompt": "Hi"}),
        (EMBEDDINGS_PARAMETERS, {"model": "m", "input": "Hi"}),
    ],
)
def test_unknown_keys_are_refused_like_openai_does(
    table: dict[str, str], body: dict[str, Any]
) -> None:
    with pytest.raises(BadRequest) as info:
        check_parameters({**body, "top_k": 40}, table)
    assert info.value.param == "top_k"
    assert info.value.code == "unknown_parameter"
    assert info.value.message == "Unrecognized request argument supplied: top_k"
    check_parameters(body, table)  # the allowed keys pass


def test_an_unprintable_or_huge_key_is_named_escaped_and_short() -> None:
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "m", "messages": MSG, "a\nb" + "x" * 5000: 1})
    assert info.value.param is not None
    assert "\n" not in info.value.param and len(info.value.param) < 150
    assert "\n" not in info.value.message and len(info.value.message) < 250


@pytest.mark.parametrize(
    "model",
    ["x" * 257, "gpt-4o\n", "gpt\x00", "a\rb", "tab\there", "\x1b[31mred", "a\u2028b"],
)
def test_model_names_that_are_too_long_or_unprintable_are_400s(model: str) -> None:
    for check, body in (
        (chat_request, {"messages": MSG}),
        (completions_request, {"prompt": "Hi"}),
        (embeddings_request, {"input": "Hi"}),
    ):
        with pytest.raises(BadRequest) as info:
            check({**body, "model": model})
        assert info.value.param == "model"
        assert model not in info.value.message


def test_model_names_up_to_256_printable_characters_pass() -> None:
    for model in ("x" * 256, "meta-llama/Llama-3.1-8B-Instruct:free", "modèle ünïcode", "a b"):
        assert chat_request({"model": model, "messages": MSG})["model"] == model


# -- what the upstream client sends ------------------------------------------------------------


def fallback(api: FakeAPI, **overrides: Any) -> FallbackSettings:
    """test_upstream's settings, with the suite's fake key and no retries."""
    return upstream_settings(api, **{"api_key_env": FAKE_KEY_ENV, "max_retries": 0, **overrides})


def test_litellm_kwargs_of_a_hostile_body_hold_only_allow_listed_keys(
    fake_api: FakeAPI, evil: Listener
) -> None:
    route = LitellmRoute(fallback(fake_api, models=MAPPED))
    body = {"model": "hosted_vllm/served-model", "messages": MSG, "metadata": {"k": "v"}}
    kwargs = route.kwargs({**body, **hostile(evil)}, "req-1")
    assert set(kwargs) <= LITELLM_PARAMETERS | LITELLM_OWN_KWARGS
    assert set(kwargs) - LITELLM_OWN_KWARGS == {"messages"}
    assert kwargs["extra_headers"] == {"x-request-id": "req-1"}
    assert kwargs["num_retries"] == 0 and kwargs["max_retries"] == 0
    assert "api_key" not in kwargs  # api_base is set: litellm's provider reads its own variable
    assert evil.url not in repr(kwargs)


@asynccontextmanager
async def upstream(api: FakeAPI, **overrides: Any) -> AsyncIterator[Upstream]:
    async with Upstream(fallback(api, **overrides), backoff_s=0.01) as client:
        yield client


@pytest.mark.parametrize(
    "keys",
    [["base_url"], ["api_base"], ["mock_response"], ["model_list"], ["api_key"], ["all"]],
    ids=lambda keys: keys[0],
)
async def test_the_real_litellm_route_never_connects_where_a_body_says(
    litellm_api: FakeAPI, evil: Listener, keys: list[str]
) -> None:
    """Validation skipped on purpose: the upstream client is the second wall."""
    keys = list(hostile(evil)) if keys == ["all"] else keys
    body = {"model": "claude", "messages": MSG, **{k: hostile(evil)[k] for k in keys}}
    async with upstream(litellm_api, models=MAPPED) as client:
        reply = await client.chat(body, request_id="req-lite")
        stream = await client.chat_stream({**body, "stream": True}, request_id="req-lite")
        async with stream:
            raw = b"".join([chunk async for chunk in stream])
    assert reply.body["choices"][0]["message"]["content"] == litellm_api.reply
    assert CANNED.encode() not in raw and litellm_api.reply.split()[0].encode() in raw
    assert litellm_api.count == 2
    assert [r.body["model"] for r in litellm_api.requests] == ["served-model"] * 2
    for request in litellm_api.requests:
        assert "x-evil" not in request.headers
        assert request.headers.get("authorization") != "Bearer sk-attacker"
    assert evil.connections == 0


async def test_litellm_itself_would_follow_a_base_url(evil: Listener) -> None:
    """The control for the test above: the listener does see a call that is handed base_url."""
    litellm = import_litellm()
    with pytest.raises(Exception):  # noqa: B017 - whatever litellm makes of a closed socket
        await litellm.acompletion(
            model="hosted_vllm/served-model",
            messages=MSG,
            base_url=evil.url,
            api_key="sk-x",
            num_retries=0,
            max_retries=0,
            timeout=5,
        )
    assert evil.connections >= 1


async def test_the_direct_route_forwards_allow_listed_keys_only(fake_api: FakeAPI) -> None:
    body = {"model": "gpt-4o-mini", "messages": MSG, "user": "u1", "metadata": {"k": "v"}}
    async with upstream(fake_api) as client:
        await client.chat({**body, "base_url": "http://x/", "top_k": 3}, request_id="r")
        await client.post_json(
            "/embeddings", {"model": "e", "input": "a", "api_key": "k", "top_k": 1}, request_id="r"
        )
        await client.post_json(
            "/completions", {"model": "c", "prompt": "Hi", "mock_response": "x"}, request_id="r"
        )
    assert [r.body for r in fake_api.requests] == [
        body,
        {"model": "e", "input": "a"},
        {"model": "c", "prompt": "Hi"},
    ]


# -- through the app ---------------------------------------------------------------------------


@asynccontextmanager
async def app_client(settings: config.Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The real app, with an engine that is never started: these requests never reach it."""
    engine = LocalEngine(config.LocalSettings(n_threads=1))
    async with in_process(settings, engine) as client:
        yield client


@pytest.mark.parametrize(
    "name", ["base_url", "api_base", "model_list", "mock_response", "api_key", "fallbacks"]
)
async def test_a_mapped_model_with_a_routing_field_is_a_400_and_nothing_is_called(
    tmp_path: Path, litellm_api: FakeAPI, evil: Listener, name: str
) -> None:
    settings = settings_for(tmp_path, litellm_api, fallback={"models": MAPPED})
    body = {"model": "claude", "messages": MSG}
    async with app_client(settings) as client:
        refused = await client.post(
            "/v1/chat/completions",
            json={**body, name: hostile(evil)[name]},
            headers={"x-frugal-route": "api"},
        )
        served = await client.post(
            "/v1/chat/completions", json=body, headers={"x-frugal-route": "api"}
        )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == name
    assert refused.json()["error"]["code"] == "unsupported_parameter"
    assert served.status_code == 200, served.text  # the route itself works, through litellm
    assert litellm_api.count == 1 and litellm_api.requests[0].body["model"] == "served-model"
    assert evil.connections == 0


async def test_an_upstream_429_reaches_the_client_as_429_with_retry_after(
    tmp_path: Path, fake_api: FakeAPI
) -> None:
    fake_api.set(fail_status=429, retry_after=7)
    settings = settings_for(tmp_path, fake_api, fallback={"max_retries": 1})
    async with app_client(settings) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": MSG},
            headers={"x-frugal-route": "api"},
        )
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "7"
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert r.headers["x-request-id"]
    assert fake_api.count == 1  # waiting 7 s would end after the call's 5 s: no retry
