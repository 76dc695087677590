"""``service_tier: "flex"`` on the in-process app (issue 41): deferred work, marked in its ledger
row (``deferred_tier``) and priced at the flex rate on the routes that tests/test_faults.py's rows
against a real ``frugal serve`` leave out: a legacy completions request (which takes
``service_tier`` as chat does; it was a 400) answered locally, and its API call's worst case
reserved at the flex rate; a chat answer served again from the response cache; a chat stream cut
by the API, charged at that rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.ledger.db.location import parse
from proxy.ledger.pricing import Billed, PriceBook, load_price_map
from proxy.ledger.tenants import keys
from proxy.serving.quotas import worst_case_tokens
from proxy.upstream.client import COMPLETIONS_PATH
from tests.conftest import AppFactory, ledger_settings, settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows
from tests.server.test_serve import ACCEPT_ANY

MODEL = "gpt-4o-mini"  # no flex rate in the map: half the standard rate
PROMPT = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8}
API = {"x-frugal-route": "api"}


def cost(row: dict[str, Any], tier: str | None) -> int | None:
    """The row's counterfactual tokens priced at ``tier`` by the proxy's own price book."""
    return PriceBook(load_price_map()).cost(
        MODEL,
        row["counterfactual_prompt_tokens"],
        row["counterfactual_completion_tokens"],
        billed=Billed(tier=tier),
    )


async def test_a_flex_completion_answered_locally_is_deferred_work_at_the_flex_rate(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory
) -> None:
    body = {**PROMPT, "service_tier": "flex"}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        response = await client.post("/v1/completions", json=body, headers=ACCEPT_ANY)
        assert await client.app.state.services.ledger.flush(10)
    assert response.status_code == 200, response.text[:300]
    assert (response.headers["x-frugal-route"], response.headers["x-frugal-reason"]) == (
        "local",
        "accepted",
    )
    assert response.json()["choices"][0]["text"] and fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["deferred_tier"], row["service_tier"], row["endpoint"]) == (
        "flex",
        "flex",
        "completions",
    )
    standard = cost(row, None)
    assert standard and row["counterfactual_cost_pusd"] == cost(row, "flex")
    assert row["counterfactual_cost_pusd"] * 2 == standard and row["api_cost_pusd"] == 0


async def test_a_flex_chat_cache_hit_is_deferred_work_at_the_flex_rate(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory
) -> None:
    settings = settings_for(tmp_path, fake_api, cache={"enabled": True})
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8,
        "temperature": 0,
        "service_tier": "flex",
    }
    async with make_client(settings) as client:
        first = await client.post("/v1/chat/completions", json=body, headers=ACCEPT_ANY)
        await client.app.state.services.quotas.written()  # the entry is stored in the background
        hit = await client.post("/v1/chat/completions", json=body, headers=ACCEPT_ANY)
        assert await client.app.state.services.ledger.flush(10)
    assert first.status_code == hit.status_code == 200, first.text[:300]
    assert first.headers["x-frugal-route"] == "local"
    assert (hit.headers["x-frugal-route"], hit.headers["x-frugal-reason"]) == ("cache", "cache")
    assert fake_api.count == 0
    local, cached = rows(tmp_path / "ledger.db")
    for row in (local, cached):
        assert (row["deferred_tier"], row["service_tier"]) == ("flex", "flex"), row["route"]
        standard = cost(row, None)
        assert standard and row["counterfactual_cost_pusd"] == cost(row, "flex"), row["route"]
        assert row["counterfactual_cost_pusd"] * 2 == standard
        assert row["api_cost_pusd"] == 0


async def test_a_flex_completions_call_reserves_its_worst_case_at_the_flex_rate(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory
) -> None:
    # A budget between the flex and the standard worst case of the same call: the flex request
    # is let through (and sent as flex), the standard one refused before any upstream call.
    book = PriceBook(load_price_map())
    body = {**PROMPT, "service_tier": "flex"}
    prompt, completion = worst_case_tokens(
        body, book.max_output_tokens(MODEL), book.max_input_tokens(MODEL), path=COMPLETIONS_PATH
    )
    standard = book.cost(MODEL, prompt, completion)
    flex = book.cost(MODEL, prompt, completion, billed=Billed(tier="flex"))
    assert standard is not None and flex is not None and flex * 2 == standard
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "nightly", monthly_budget_pusd=(standard + flex) // 2)
    auth = {"authorization": f"Bearer {key}", **API}
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        refused = await client.post("/v1/completions", json=PROMPT, headers=auth)
        assert fake_api.count == 0
        allowed = await client.post("/v1/completions", json=body, headers=auth)
        assert await client.app.state.services.ledger.flush(10)
    assert refused.status_code == 429, refused.text[:300]
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert allowed.status_code == 200, allowed.text[:300]
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/completions" and sent["service_tier"] == "flex"
    row = [r for r in rows(tmp_path / "ledger.db") if r["status"] == 200][0]
    assert (row["deferred_tier"], row["service_tier"], row["route"]) == ("flex", "flex", "api")
    paid = book.cost(
        MODEL, row["prompt_tokens"], row["completion_tokens"], billed=Billed(tier="flex")
    )
    assert row["api_cost_pusd"] == paid and paid


async def test_a_flex_stream_the_api_cut_is_charged_at_the_flex_rate(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory
) -> None:
    # The API sends four events, one each 50 ms, and drops the connection: no usage comes, so
    # the tokens are counted (usage_estimated), and priced at the tier the call was sent at.
    fake_api.set(
        reply="one two three four five six seven eight", cut_stream_after=4, per_token_s=0.05
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to eight."}],
        "max_tokens": 16,
        "service_tier": "flex",
        "stream": True,
    }
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        response = await client.post("/v1/chat/completions", json=body, headers=API)
        assert await client.app.state.services.ledger.flush(10)
    assert response.status_code == 200  # the status line was out before the cut
    assert fake_api.requests[-1][2]["service_tier"] == "flex"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["deferred_tier"], row["service_tier"], row["route"]) == ("flex", "flex", "api")
    assert row["token_source"] == "usage_estimated" and row["completion_tokens"]
    book = PriceBook(load_price_map())
    paid = book.cost(
        MODEL, row["prompt_tokens"], row["completion_tokens"], billed=Billed(tier="flex")
    )
    assert row["api_cost_pusd"] == paid
    assert paid and paid * 2 == book.cost(MODEL, row["prompt_tokens"], row["completion_tokens"])


async def test_a_flex_fallback_waits_flex_timeout_s_not_the_interactive_timeout(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory
) -> None:
    # The API answers after 1.5 s; [fallback] timeout_s is 0.5 s: a standard call times out
    # (504), a flex one waits [fallback] flex_timeout_s (15 minutes by default) and gets its
    # answer, streamed or not.
    fake_api.set(latency_s=1.5)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
    flex = {**chat, "service_tier": "flex"}
    settings = settings_for(tmp_path, fake_api, fallback={"timeout_s": 0.5, "max_retries": 0})
    async with make_client(settings) as client:
        standard = await client.post("/v1/chat/completions", json=chat, headers=API)
        waited = await client.post("/v1/chat/completions", json=flex, headers=API)
        streamed = await client.post(
            "/v1/chat/completions", json={**flex, "stream": True}, headers=API
        )
        text = await client.post(
            "/v1/completions", json={**PROMPT, "service_tier": "flex"}, headers=API
        )
    assert standard.status_code == 504, standard.text[:300]
    assert waited.status_code == 200, waited.text[:300]
    assert waited.json()["choices"][0]["message"]["content"]
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    assert '"error"' not in streamed.text
    assert text.status_code == 200, text.text[:300]
    assert [sent.get("service_tier") for _, _, sent in fake_api.requests] == [
        None,
        "flex",
        "flex",
        "flex",
    ]
