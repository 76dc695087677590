"""The litellm route's bounded clients (proxy/upstream/litellm_clients.py), against the fake API
on loopback: every provider named in ``HANDLER_PROVIDERS`` and ``SDK_PROVIDERS`` reads its
answer through the route's client, so a 24 MiB answer (a JSON body, or a stream whose one event
is a 24 MiB line) is cut soon after a 1 MiB bound, a 502 that says so; a provider of each kind
still answers through it, and ``frugal``'s own route picks the clients with litellm's resolver
(one ``AsyncOpenAI`` per base and key, none without a key)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import FallbackSettings
from proxy.upstream.failures import translate
from proxy.upstream.litellm_clients import HANDLER_PROVIDERS, SDK_PROVIDERS
from proxy.upstream.litellm_route import LitellmRoute, answer_of, import_litellm, sse_of
from tests.conftest import module_api
from tests.fake_api import FakeAPI

api = module_api()
BOUND = 1024 * 1024
HUGE = 24 * 1024 * 1024
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
KINDS = sorted((p, "handler") for p in HANDLER_PROVIDERS) + sorted(
    (p, "sdk") for p in SDK_PROVIDERS
)


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI) -> None:
    api.reset()


def _route() -> LitellmRoute:
    return LitellmRoute(FallbackSettings(api_base="", max_answer_bytes=BOUND, timeout_s=10.0))


def _kwargs(api: FakeAPI, provider: str, stream: bool) -> dict[str, Any]:
    """What the route's call is given, with the fake as the provider's base (the route itself
    lets litellm read the provider's variables)."""
    kwargs: dict[str, Any] = {
        "model": f"{provider}/served-model",
        "messages": MESSAGES,
        "api_base": api.url,
        "api_key": "sk-litellm-clients-test",
        "timeout": 10.0,
        "num_retries": 0,
        "max_retries": 0,
        "drop_params": True,
        "stream": stream,
    }
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


async def _read(route: LitellmRoute, kwargs: dict[str, Any]) -> bytes:
    result = await route.call(kwargs)
    if not kwargs["stream"]:
        return answer_of(result)[1]
    try:
        return b"".join([chunk async for chunk in sse_of(result)])
    finally:
        await result.aclose()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("provider", "kind"), KINDS, ids=[f"{p}-{k}" for p, k in KINDS])
async def test_every_bounded_provider_reads_its_answer_only_up_to_the_bound(
    api: FakeAPI, provider: str, kind: str, stream: bool
) -> None:
    api.set(huge_reply_bytes=HUGE)  # a MiB a write, no Content-Length
    route = _route()
    try:
        with pytest.raises(Exception) as caught:
            await _read(route, _kwargs(api, provider, stream))
    finally:
        await route.aclose()
    error = translate(caught.value, 1)
    print(f"{provider} ({kind}) {'stream' if stream else 'json'}: sent {api.huge_sent:,} bytes")
    what = "stream event" if stream else "answer"
    assert error.status == 502, (provider, repr(caught.value)[:300])
    assert f"{what} was too large: more than {BOUND} bytes" in error.message
    assert api.count == 1
    assert api.huge_sent <= 16 * 1024 * 1024  # read whole, it would be all 24 MiB


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("provider", ["deepseek", "deepinfra"])
async def test_a_provider_of_each_kind_still_answers_through_the_bounded_client(
    api: FakeAPI, provider: str, stream: bool
) -> None:
    api.set(reply="Paris.")
    route = _route()
    try:
        raw = await _read(route, _kwargs(api, provider, stream))
    finally:
        await route.aclose()
    assert b"Paris." in raw or (stream and b"Paris" in raw), raw[:500]
    assert [r.body["model"] for r in api.requests] == ["served-model"]
    assert api.requests[0].headers["authorization"] == "Bearer sk-litellm-clients-test"


async def test_an_sdk_provider_gets_one_client_per_base_and_key_and_none_without_a_key(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litellm's own resolver gives the key and base: the same ones share a client, another
    key gets its own, and a provider for which it finds no key is handed none (litellm then
    decides as it did before)."""
    monkeypatch.delenv("DEEPINFRA_API_KEY", raising=False)
    route = _route()
    await route.start()
    litellm = import_litellm()
    pick = route._clients.for_call
    one = pick(litellm, _kwargs(api, "deepinfra", False))
    assert one is not None and pick(litellm, _kwargs(api, "deepinfra", False)) is one
    assert str(one.base_url).rstrip("/") == api.url.rstrip("/")
    other = pick(litellm, {**_kwargs(api, "deepinfra", False), "api_key": "sk-another"})
    assert other is not None and other is not one
    assert pick(litellm, {**_kwargs(api, "deepinfra", True)}) is not one  # streams: per line
    keyless = {k: v for k, v in _kwargs(api, "deepinfra", False).items() if k != "api_key"}
    assert pick(litellm, keyless) is None
    assert pick(litellm, _kwargs(api, "cohere", False)) is None  # takes no client of ours
    await route.aclose()


# Providers handed no client of the route's: litellm asks its own places for one (its cache of
# clients, its module-level client, the httpx client of the SDK clients it makes), where the
# route has put bounded ones. Each with what litellm needs to reach the fake. Not here, for they
# cannot be pointed at a fake on loopback: bytez and microsoft_365_copilot (fixed hosts), oci
# (its request signing), replicate and sagemaker (hosts of their own), vertex_ai (Google's SDK
# and credentials).
_AWS = {
    "AWS_ACCESS_KEY_ID": "AKIAFRUGALTEST",
    "AWS_SECRET_ACCESS_KEY": "frugal-test-secret",
    "AWS_REGION_NAME": "us-east-1",
}
NO_CLIENT: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "azure": ({"api_version": "2024-10-21"}, {}),
    "bedrock": ({"aws_region_name": "us-east-1"}, _AWS),
    "cloudflare": ({}, {"CLOUDFLARE_ACCOUNT_ID": "frugal"}),
    "cohere": ({}, {}),
    "cohere_chat": ({}, {}),
    "langgraph": ({}, {}),
    "text-completion-codestral": ({}, {}),
    "text-completion-inception": ({}, {}),
    "text-completion-openai": ({"api_base": "/tc"}, {}),  # the fake's own /completions is small
    "watsonx": ({"project_id": "frugal"}, {"WATSONX_TOKEN": "frugal-test-token"}),
}
# (provider, stream) whose handler ends the stream quietly at the bound (langgraph's stream: what
# came before it is relayed, then the end): the read is bounded all the same.
OWN_ERRORS = {("langgraph", True)}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("provider", sorted(NO_CLIENT))
async def test_a_provider_handed_no_client_reads_through_litellms_own_places_bounded(
    api: FakeAPI, provider: str, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra, env = NO_CLIENT[provider]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    api.set(huge_reply_bytes=HUGE, huge_aws_frame=provider == "bedrock")
    kwargs = {**_kwargs(api, provider, stream), **extra}
    if kwargs["api_base"].startswith("/"):
        kwargs["api_base"] = api.url + kwargs["api_base"]
    route = _route()
    caught: Exception | None = None
    raw = b""
    try:
        raw = await _read(route, kwargs)
    except Exception as exc:
        caught = exc
    finally:
        await route.aclose()
    error = translate(caught, 1) if caught is not None else None
    print(
        f"{provider} {'stream' if stream else 'json'}: sent {api.huge_sent:,} bytes, "
        f"{len(raw):,} relayed, {(error.status, error.message[:90]) if error else 'no error'}"
    )
    assert api.count == 1 and len(raw) <= BOUND
    assert api.huge_sent <= 16 * 1024 * 1024  # read whole, it would be all 24 MiB
    if (provider, stream) not in OWN_ERRORS:
        what = "stream event" if stream else "answer"
        assert error is not None and error.status == 502, repr(caught)[:300]
        assert f"{what} was too large: more than {BOUND} bytes" in error.message


async def test_the_route_puts_litellms_own_clients_back_when_it_closes() -> None:
    """What the route puts in litellm's places while it runs is taken out at its close, and
    what litellm had there is back."""
    litellm = import_litellm()
    cache = litellm.in_memory_llm_clients_cache
    session = litellm.aclient_session
    route = _route()
    await route.start()
    assert litellm.in_memory_llm_clients_cache is not cache
    assert litellm.aclient_session is not None and litellm.aclient_session is not session
    assert litellm.module_level_aclient is route._clients._shared["module_level_aclient"]
    await route.aclose()
    assert litellm.in_memory_llm_clients_cache is cache and litellm.aclient_session is session
    assert "module_level_aclient" not in vars(litellm) or (
        litellm.module_level_aclient is not route._clients._shared.get("module_level_aclient")
    )


async def test_routes_closed_out_of_order_leave_litellms_own_clients_in_place() -> None:
    """Two routes at once (two apps in one process), the first closed first: the second's close
    puts back what litellm had before either, not the first route's closed clients."""
    litellm = import_litellm()
    cache, session = litellm.in_memory_llm_clients_cache, litellm.aclient_session
    first, second = _route(), _route()
    await first.start()
    await second.start()
    await first.aclose()
    assert litellm.aclient_session is second._clients._shared["aclient_session"]
    await second.aclose()
    assert litellm.in_memory_llm_clients_cache is cache and litellm.aclient_session is session
