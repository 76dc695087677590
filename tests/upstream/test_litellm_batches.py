"""A litellm-routed provider's rejects at batch price (proxy/upstream/litellm_batches.py,
deferred.py), against the real fake API on loopback.

``[fallback.models]`` maps ``gpt-4o-mini`` to ``groq/served-model``, and litellm's own
resolver is pointed at the fake through Groq's variables (``GROQ_API_BASE``, ``GROQ_API_KEY``),
while ``[fallback] api_base`` has a key of its own: the fake takes only Groq's key, so a call
that reached it was made at the base and with the key litellm gives for the provider. Covered:
the rejects reach the fake's Batch API as one batch (not single calls), under the provider's
own model name, and come back priced at the batch rate in the ledger (the batch runner on a
real SQLite file); a batch made before a restart is resumed at the same provider; a provider
not in the list (``hosted_vllm``) still goes one call per line; a listed provider that answers
"not supported" (404 or 400) has that batch sent one call per line, once, said in a log line
without the key; one pool per base and key, closed at shutdown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.config import BatchSettings, FallbackSettings
from proxy.errors import UpstreamStatus
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from proxy.ledger.db.migrate import open_database
from proxy.ledger.pricing import Price, PriceBook, pico_per_token
from proxy.serving.batch_lines import Attempted, Rejected
from proxy.serving.batch_runner import BatchRunner
from proxy.upstream.client import Upstream
from proxy.upstream.deferred import Deferred, DeferredLine
from proxy.upstream.litellm_batches import ProviderWire
from tests.conftest import module_api
from tests.fake_api import DEFAULT_REPLY, FakeAPI, usage_for, words

KEY_ENV = "FRUGAL_TEST_LITELLM_BATCH_KEY"
KEY = "sk-test-api-base-0123456789"
GROQ_KEY = "gsk-test-groq-9876543210"
CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
GROQ = {MODEL: "groq/served-model"}
PRICES = PriceBook(
    {},
    {
        MODEL: Price(input=pico_per_token(0.15), output=pico_per_token(0.6)),
        "served-model": Price(input=pico_per_token(0.05), output=pico_per_token(0.08)),
    },
)

api = module_api()


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api.reset()
    # Only the provider's own key is taken; a chat answer says its tier, as Groq's do (litellm's
    # Groq handler reads it).
    api.set(require_key=GROQ_KEY, served_tier="on_demand")
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("GROQ_API_BASE", api.url)
    monkeypatch.setenv("GROQ_API_KEY", GROQ_KEY)


@asynccontextmanager
async def upstream(api: FakeAPI, models: dict[str, str]) -> AsyncIterator[Upstream]:
    fallback = FallbackSettings(
        api_base=api.url, api_key_env=KEY_ENV, timeout_s=5.0, connect_timeout_s=1.0, models=models
    )
    async with Upstream(fallback, backoff_s=0.01) as client:
        yield client


def deferred(client: Upstream, **batch: Any) -> Deferred:
    settings = BatchSettings(**{"poll_interval_s": 0.01, "max_poll_interval_s": 0.05, **batch})
    return Deferred(client, settings)


def chat_line(cid: str, text: str = "What is the capital of France?") -> DeferredLine:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return DeferredLine(custom_id=cid, url=CHAT, body=body)


def calls(api: FakeAPI, prefix: str, method_path: str = "") -> int:
    return sum(1 for r in api.requests if r.path.startswith(prefix + method_path))


# -- the rejects go as one batch -----------------------------------------------------------------


async def test_a_groq_models_lines_reach_the_providers_batch_api_as_one_batch(
    api: FakeAPI,
) -> None:
    lines = [chat_line(f"line-{i}", f"Question number {i}?") for i in range(3)]
    async with upstream(api, GROQ) as client:
        outcome = await deferred(client).send(lines, request_id="req-1")
    assert api.batches_made == 1 and api.single_calls == 0
    assert [cid for cid, _, _ in api.batch_lines] == ["line-0", "line-1", "line-2"]
    assert {body["model"] for _, _, body in api.batch_lines} == {"served-model"}
    assert {r.headers["authorization"] for r in api.requests} == {f"Bearer {GROQ_KEY}"}
    assert outcome.unanswered == () and outcome.batches[0]["status"] == "completed"
    for line in lines:
        result = outcome.results[line.custom_id]
        assert result.ok and result.body["choices"][0]["message"]["content"] == DEFAULT_REPLY
        assert result.usage == usage_for(line.body, len(words(DEFAULT_REPLY)))


async def test_a_groq_batch_made_before_a_restart_is_resumed_at_the_provider(
    api: FakeAPI,
) -> None:
    api.set(batch_polls=1000)  # never ends while the first client waits
    lines = [chat_line("a"), chat_line("b")]
    made: list[str] = []

    async def submitted(batch_id: str, ids: tuple[str, ...]) -> None:
        made.append(batch_id)
        raise RuntimeError("the proxy died here")

    async with upstream(api, GROQ) as client:
        with pytest.raises(RuntimeError):
            await deferred(client).send(lines, request_id="r", submitted=submitted)
    api.set(batch_polls=0)
    async with upstream(api, GROQ) as client:  # a new client, as after a restart
        outcome = await deferred(client).resume(made[0], lines, request_id="r2")
    assert api.batches_made == 1 and api.single_calls == 0
    assert sorted(outcome.results) == ["a", "b"] and outcome.unanswered == ()


# -- priced at the billed tier --------------------------------------------------------------------


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    database = parse(str(tmp_path / "ledger.db"))
    open_database(database)
    shared = Pool(database, size=8, timeout_s=10.0)
    yield shared
    shared.close()


async def reject(url: str, body: dict[str, Any], *, deadline: float, priority: str) -> Attempted:
    return Rejected(reason="low_quality")


def make_batch(pool: Pool, n: int) -> str:
    requests = [
        {
            "custom_id": f"task-{i}",
            "method": "POST",
            "url": CHAT,
            "body": chat_line("", f"q {i}").body,
        }
        for i in range(n)
    ]
    content = "".join(json.dumps(r) + "\n" for r in requests).encode()
    upload = FileStore(pool, quota_bytes=10**9).put(
        "id:1", purpose="batch", filename="in.jsonl", content=content
    )
    return BatchStore(pool, prices=PRICES).create("id:1", input_file_id=upload.id, endpoint=CHAT).id


@pytest.mark.parametrize("refused", [None, 404], ids=["batch", "unsupported"])
async def test_a_groq_models_rejects_are_priced_at_the_tier_their_calls_were_billed_at(
    api: FakeAPI, pool: Pool, refused: int | None
) -> None:
    """The rejects go up as one upstream batch, each row at the batch rate; when the provider
    refuses to make the batch, they go one call each, and each row is at the standard rate
    (what the provider bills a single call), not the batch rate."""
    api.set(batch_unsupported=refused)
    make_batch(pool, 4)
    async with upstream(api, GROQ) as client:
        store = BatchStore(pool, prices=PRICES)
        runner = BatchRunner(store, reject, deferred(client), width=4, lease_s=60.0, idle_s=0.05)
        await runner.drain()
    if refused is None:
        assert api.batches_made == 1 and api.single_calls == 0 and len(api.batch_lines) == 4
    else:
        assert api.batches_made == 0 and api.single_calls == 4
    with pool.transaction() as tx:
        found = tx.rows(
            "SELECT route, api_model, prompt_tokens, completion_tokens, api_cost_pusd, "
            "service_tier, deferred_tier FROM requests"
        )
    batch_price = PRICES.price("served-model", "batch")
    standard = PRICES.price("served-model")
    assert batch_price is not None and standard is not None
    assert batch_price.input * 2 == standard.input  # half the standard rate: no batch rate given
    billed, price = ("batch", batch_price) if refused is None else (None, standard)
    assert len(found) == 4
    for route, api_model, prompt, completion, cost, tier, deferred_tier in found:
        assert (route, api_model, tier, deferred_tier) == ("api", "served-model", billed, "batch")
        assert prompt > 0 and completion > 0
        assert cost == prompt * price.input + completion * price.output
    print("ledger rows:", found)


# -- the providers that stay sync ----------------------------------------------------------------


async def test_a_provider_not_in_the_list_still_goes_one_call_a_line(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", api.url)
    monkeypatch.setenv("HOSTED_VLLM_API_KEY", GROQ_KEY)
    async with upstream(api, {MODEL: "hosted_vllm/served-model"}) as client:
        sender = deferred(client)
        assert sender.api(MODEL) is None
        outcome = await sender.send([chat_line("a"), chat_line("b")], request_id="r")
    assert api.batches_made == 0 and api.single_calls == 2
    assert sorted(outcome.results) == ["a", "b"] and outcome.unanswered == ()


@pytest.mark.parametrize("status", [404, 400])
async def test_a_listed_provider_that_refuses_batches_has_that_batch_sent_one_call_a_line_once(
    api: FakeAPI, status: int
) -> None:
    api.set(batch_unsupported=status)
    lines = [chat_line("a"), chat_line("b"), chat_line("c")]
    with capture_logs() as logs:
        async with upstream(api, GROQ) as client:
            outcome = await deferred(client).send(lines, request_id="r")
    assert api.batches_made == 0 and api.single_calls == 3
    assert calls(api, "/v1/batches") == 1  # the batch was asked for once, not again
    assert calls(api, "/v1/files") == 2  # the upload, then its deletion
    assert api.batch_api.files == {}
    assert sorted(outcome.results) == ["a", "b", "c"] and outcome.unanswered == ()
    assert all(result.ok for result in outcome.results.values())
    said = [e for e in logs if e["event"] == "upstream_batch_unsupported"]
    assert len(said) == 1
    assert said[0] | {"log_level": "warning"} == {
        "event": "upstream_batch_unsupported",
        "log_level": "warning",
        "provider": "groq",
        "model": MODEL,
        "status": status,
        "lines": 3,
        "sent_as": "sync",
    }
    assert GROQ_KEY not in repr(logs) and "capital" not in repr(logs)


async def test_a_refusal_that_does_not_say_batches_are_unsupported_is_raised_as_it_is(
    api: FakeAPI,
) -> None:
    api.set(fail_status=400, error_message="the file is malformed", fail_times=1)
    async with upstream(api, GROQ) as client:
        with pytest.raises(UpstreamStatus) as raised:
            await deferred(client).send([chat_line("a")], request_id="r")
    assert (raised.value.status, raised.value.message) == (400, "the file is malformed")
    assert api.single_calls == 0 and api.batches_made == 0 and api.count == 1


# -- one pool per base and key -------------------------------------------------------------------


async def test_two_models_of_one_provider_share_one_pool_closed_at_shutdown(api: FakeAPI) -> None:
    models = {MODEL: "groq/served-model", "gpt-4o": "groq/other-model"}
    async with upstream(api, models) as client:
        sender = deferred(client)
        first, second = sender.api(MODEL), sender.api("gpt-4o")
        assert first is not None and second is not None
        wires = [first.wire, second.wire]
        assert all(isinstance(w, ProviderWire) for w in wires)
        route = wires[0]._route  # type: ignore[attr-defined]
        assert wires[1]._route is route  # type: ignore[attr-defined]
        other = DeferredLine(
            custom_id="o", url=CHAT, body={**chat_line("o").body, "model": "gpt-4o"}
        )
        await sender.send([chat_line("a"), other], request_id="r")
        assert route._session is not None and not route._session.closed
    assert route._session is None  # closed with the client
    assert api.batches_made == 2
    assert [body["model"] for _, _, body in api.batch_lines] == ["served-model", "other-model"]
