"""Per-key budgets, rpm and models through the app (proxy/serving/quotas.py), on SQLite and on a
real PostgreSQL, with the real engine and the fake API on loopback: the budget is never passed,
its reservations are always released, and a lost database fails the API closed (503) while
local answers are still served."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database, parse
from proxy.ledger.pricing import (
    AUDIO_INPUT_BOUND,
    AUDIO_OUTPUT_BOUND,
    Billed,
    PriceBook,
    load_price_map,
)
from proxy.ledger.tenants import keys
from proxy.ledger.tenants.budgets import Budgets, month_of
from proxy.serving.charges import charge_worst_case
from proxy.serving.exchange import Exchange
from proxy.serving.quotas import worst_case_tokens
from tests import pg
from tests.conftest import AppFactory, ledger_settings
from tests.fake_api import FakeAPI

ASK = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}]}
API = {"x-frugal-route": "api"}


def services_of(client: Any) -> Any:
    return client.app.state.services


def spend(db: Database, name: str) -> tuple[int, int]:
    """(spent, reserved) pico-dollars of the key ``name`` this month."""
    pool = Pool(db)
    try:
        usage = Budgets(pool).usage(month_of(time.time())).get(name)
    finally:
        pool.close()
    return (usage.spent_pusd, usage.reserved_pusd) if usage else (0, 0)


async def test_a_budget_is_never_passed_and_its_reservations_are_released(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    # gpt-4o-mini: $0.15 / $0.60 per Mtok; a worst case of ~30 prompt + 20 answer tokens is
    # about $0.000017, so a $0.0001 budget holds a few of these requests, not twenty. All twenty
    # are in flight at once: the key's share of the slots (a quarter by default) must hold them.
    key = keys.create(database, "small", monthly_budget_pusd=100_000_000, max_concurrency=20)
    auth = {"authorization": f"Bearer {key}", **API}
    async with open_app() as client:
        replies = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json={**ASK, "max_tokens": 20}, headers=auth)
                for _ in range(20)
            )
        )
        statuses = sorted(r.status_code for r in replies)
        refused = [r for r in replies if r.status_code == 429]
        await asyncio.sleep(0.3)  # the settles run in the background
        spent, reserved = spend(database, "small")
    assert 200 in statuses and refused, statuses
    error = refused[0].json()["error"]
    assert error["code"] == "insufficient_quota" and "budget" in error["message"]
    assert 0 < spent <= 100_000_000 and reserved == 0
    assert fake_api.count == statuses.count(200)


async def test_a_key_may_use_only_its_models_and_its_rpm(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    # rpm is counted from the headers, before the body names a model: the 403 counts too.
    key = keys.create(database, "narrow", rpm=3, models=("gpt-4o-mini", "local"))
    auth = {"authorization": f"Bearer {key}", **API}
    async with open_app() as client:
        other = await client.post(
            "/v1/chat/completions", json={**ASK, "model": "gpt-4o"}, headers=auth
        )
        first = await client.post("/v1/chat/completions", json=ASK, headers=auth)
        second = await client.post("/v1/chat/completions", json=ASK, headers=auth)
        third = await client.post("/v1/chat/completions", json=ASK, headers=auth)
    assert other.status_code == 403 and other.json()["error"]["param"] == "model"
    assert "gpt-4o-mini" in other.json()["error"]["message"]
    assert (first.status_code, second.status_code) == (200, 200)
    assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1
    assert third.json()["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.skipif(pg.binaries() is None, reason="PostgreSQL is not installed")
async def test_a_lost_database_fails_the_budget_closed_and_local_answers_go_on(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    with pg.running() as server:
        assert server is not None
        db = parse(server.database())
        key = keys.create(db, "team", monthly_budget_pusd=10**12)
        auth = {"authorization": f"Bearer {key}"}
        admin = {"authorization": "Bearer " + keys.create(db, "ops", admin=True)}
        async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
            ok = await client.post("/v1/chat/completions", json=ASK, headers={**auth, **API})
            assert ok.status_code == 200, ok.text
            server.stop()
            refused = await client.post("/v1/chat/completions", json=ASK, headers={**auth, **API})
            local = await client.post(
                "/v1/chat/completions",
                json={**ASK, "model": "local", "max_tokens": 8},
                headers=auth,
            )
            health = (await client.get("/healthz", headers=admin)).json()  # the full one
            server.start()  # back: the API fallback is allowed again
            again = await client.post("/v1/chat/completions", json=ASK, headers={**auth, **API})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "budget_unavailable"
    assert local.status_code == 200 and local.headers["x-frugal-route"] == "local"
    assert health["status"] == "degraded"
    assert health["budgets"]["state"] == "degraded" and health["budgets"]["reason"]
    assert again.status_code == 200


# -- /v1/completions and /v1/embeddings take the same checks ---------------------------------

PROMPT = {"model": "gpt-4o-mini", "prompt": "Say hi.", "max_tokens": 20}
# text-embedding-3-small: $0.02 per Mtok in, nothing out. 500 words are reserved as ~1,270
# tokens (the JSON's bytes / 2) and cost 500: a $0.00006 budget holds two reservations at
# once and six real calls at most.
EMBED = {"model": "text-embedding-3-small", "input": "word " * 500}


@pytest.mark.parametrize(
    ("path", "body", "budget_pusd"),
    [("/v1/completions", PROMPT, 100_000_000), ("/v1/embeddings", EMBED, 60_000_000)],
    ids=["completions", "embeddings"],
)
async def test_completions_and_embeddings_hold_to_the_budget(
    open_app: AppFactory,
    fake_api: FakeAPI,
    database: Database,
    path: str,
    body: dict[str, Any],
    budget_pusd: int,
) -> None:
    key = keys.create(database, "small", monthly_budget_pusd=budget_pusd, max_concurrency=20)
    auth = {"authorization": f"Bearer {key}", **API}
    async with open_app() as client:
        replies = await asyncio.gather(
            *(client.post(path, json=body, headers=auth) for _ in range(20))
        )
        statuses = sorted(r.status_code for r in replies)
        refused = [r for r in replies if r.status_code == 429]
        await asyncio.sleep(0.3)  # the settles run in the background
        spent, reserved = spend(database, "small")
    assert 200 in statuses and refused, statuses
    assert set(statuses) == {200, 429}, statuses
    error = refused[0].json()["error"]
    assert error["code"] == "insufficient_quota" and "budget" in error["message"]
    assert 0 < spent <= budget_pusd and reserved == 0
    assert fake_api.count == statuses.count(200)


async def test_completions_and_embeddings_keep_the_keys_models_and_rpm(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    # Each key's 403 below counts against its rpm (counted before the body names the model).
    text = keys.create(database, "text", rpm=3, models=("gpt-4o-mini",))
    vectors = keys.create(database, "vectors", rpm=2, models=("text-embedding-3-small",))
    as_text = {"authorization": f"Bearer {text}", **API}
    as_vectors = {"authorization": f"Bearer {vectors}", **API}
    async with open_app() as client:
        no_embed = await client.post("/v1/embeddings", json=EMBED, headers=as_text)
        no_prompt = await client.post("/v1/completions", json=PROMPT, headers=as_vectors)
        completions = [
            await client.post("/v1/completions", json=PROMPT, headers=as_text) for _ in range(3)
        ]
        embeddings = [
            await client.post("/v1/embeddings", json=EMBED, headers=as_vectors) for _ in range(2)
        ]
    for refused in (no_embed, no_prompt):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["param"] == "model"
    assert "gpt-4o-mini" in no_embed.json()["error"]["message"]
    assert [r.status_code for r in completions] == [200, 200, 429]
    assert [r.status_code for r in embeddings] == [200, 429]
    for limited in (completions[-1], embeddings[-1]):
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert fake_api.count == 3


async def test_report_by_key_shows_each_budget_and_its_use(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    from decimal import Decimal

    from proxy.ledger.reports.build import Period, build
    from proxy.ledger.reports.formats import render
    from proxy.ledger.reports.rollup import money

    capped = keys.create(database, "capped", monthly_budget_pusd=10**12)  # $1
    free = keys.create(database, "free")
    async with open_app() as client:
        for key in (capped, capped, free):
            auth = {"authorization": f"Bearer {key}", **API}
            reply = await client.post("/v1/chat/completions", json=ASK, headers=auth)
            assert reply.status_code == 200, reply.text
        await asyncio.sleep(0.3)  # the settles run in the background
    spent, _ = spend(database, "capped")
    report = build(database, Period.month(None), 0, by="key")
    groups = {g["key"]: g for g in report["groups"]}
    assert spent > 0
    assert groups["capped"]["requests"] == 2
    assert groups["capped"]["monthly_budget_usd"] == Decimal("1.000000")
    assert groups["capped"]["budget_spent_usd"] == money(spent)
    assert groups["capped"]["budget_spent_usd"] == groups["capped"]["api_cost_usd"]
    assert groups["capped"]["budget_used_share"] == round(spent / 10**12, 4)
    assert groups["capped"]["budget_month"] == report["month"]
    assert "monthly_budget_usd" not in groups["free"]
    table = render(report, "table")
    assert "Budget used" in table and "$1.00" in table
    assert "budget_spent_usd" not in build(database, Period.month(None), 0, by="model")["groups"][0]


def _big_schema(width: int) -> dict[str, Any]:
    """An object schema of ``width`` described string properties: about 60 bytes each."""
    return {
        "type": "object",
        "properties": {
            f"field_{i:05d}": {"type": "string", "description": "x" * 40} for i in range(width)
        },
    }


# Each body's worst case passes a $0.001 budget at gpt-4o-mini ($0.15 / $0.60 per Mtok) only
# through a field the reservation once left out: 50 functions of ~2 KB, a ~100 KB
# response_format schema or tool, or best_of 20 with 500 answer tokens each ($0.006).
BILLED_FIELDS = {
    "functions": (
        "/v1/chat/completions",
        {
            **ASK,
            "max_tokens": 5,
            "functions": [{"name": f"fn_{i}", "parameters": _big_schema(30)} for i in range(50)],
        },
    ),
    "response_format": (
        "/v1/chat/completions",
        {
            **ASK,
            "max_tokens": 5,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": _big_schema(1600)},
            },
        },
    ),
    "tools": (
        "/v1/chat/completions",
        {
            **ASK,
            "max_tokens": 5,
            "tools": [
                {"type": "function", "function": {"name": "big", "parameters": _big_schema(1600)}}
            ],
        },
    ),
    "best_of": (
        "/v1/completions",
        {"model": "gpt-4o-mini", "prompt": "Say hi.", "max_tokens": 500, "best_of": 20},
    ),
}


@pytest.mark.parametrize("field", sorted(BILLED_FIELDS))
async def test_every_billed_field_is_reserved_before_the_api_is_called(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    field: str,
) -> None:
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "tight", monthly_budget_pusd=1_000_000_000, max_concurrency=20)
    auth = {"authorization": f"Bearer {key}", **API}
    path, body = BILLED_FIELDS[field]
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        replies = await asyncio.gather(
            *(client.post(path, json=body, headers=auth) for _ in range(20))
        )
        # The same request without the field fits the budget: the field alone is what is held.
        lean = {k: v for k, v in body.items() if k != field}
        small = await client.post(path, json=lean, headers=auth)
        await asyncio.sleep(0.3)  # the settles run in the background
        spent, reserved = spend(db, "tight")
    assert [r.status_code for r in replies] == [429] * 20, [r.text[:200] for r in replies]
    error = replies[0].json()["error"]
    assert error["code"] == "insufficient_quota" and "budget" in error["message"]
    assert small.status_code == 200, small.text[:300]
    assert fake_api.count == 1  # the lean request only
    assert 0 < spent <= 1_000_000_000 and reserved == 0


async def test_without_max_tokens_the_models_own_output_limit_is_reserved(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
) -> None:
    # gpt-4o-mini's map entry says its answers run to 16,384 tokens ($0.60 per Mtok: $0.0098);
    # 4,096 of them ($0.0025) were reserved before. A $0.005 budget holds the old worst case,
    # not the real one: the request is refused, and the same one bounded by max_tokens is not.
    limit = PriceBook(load_price_map()).max_output_tokens("gpt-4o-mini")
    assert limit == 16_384
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "capped", monthly_budget_pusd=5_000_000_000)
    auth = {"authorization": f"Bearer {key}", **API}
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        unbounded = await client.post("/v1/chat/completions", json=ASK, headers=auth)
        bounded = await client.post(
            "/v1/chat/completions", json={**ASK, "max_tokens": 4096}, headers=auth
        )
    assert unbounded.status_code == 429, unbounded.text[:300]
    message = unbounded.json()["error"]["message"]
    held = float(message.split("up to $", 1)[1].split(" ", 1)[0])
    assert held >= limit * 0.60 / 1e6  # every one of the 16,384 tokens is held
    assert bounded.status_code == 200, bounded.text[:300]
    assert fake_api.count == 1  # the bounded request only


def test_a_call_whose_cost_is_never_known_is_charged_the_same_output_limit() -> None:
    # What an abandoned call is charged when nothing of it can be known is what was reserved
    # for it: the model's own output limit when the request named no max_tokens.
    ex = Exchange(request_id="r", worst_body=dict(ASK), worst_max_output=16_384)
    charge_worst_case(ex)
    assert ex.completion_tokens == 16_384 and ex.token_source == "worst_case"
    ex = Exchange(request_id="r", worst_body={**ASK, "max_tokens": 20, "n": 3})
    charge_worst_case(ex)
    assert ex.completion_tokens == 60


def test_a_list_of_prompts_is_reserved_every_answer_of_every_prompt() -> None:
    # OpenAI answers n (best_of) choices for each prompt of a list (issue 39): 200 prompts of
    # 50 tokens are 10,000 completion tokens, every prompt's bytes on the prompt side.
    one = {"model": "gpt-4o-mini", "prompt": "Say hi.", "max_tokens": 50}
    listed = {**one, "prompt": ["Say hi."] * 200}
    tokens = {**one, "prompt": [[15496, 11, 995]] * 200, "n": 2}
    assert worst_case_tokens(one, path="/completions")[1] == 50
    assert worst_case_tokens(listed, path="/completions")[1] == 200 * 50
    assert worst_case_tokens(tokens, path="/completions")[1] == 2 * 200 * 50
    assert worst_case_tokens({**one, "prompt": [15496, 11]}, path="/completions")[1] == 50
    assert worst_case_tokens(listed, path="/completions")[0] >= len('"Say hi.",') * 200 // 2
    assert worst_case_tokens({"model": "e", "input": ["a"] * 9}, path="/embeddings")[1] == 0


@pytest.mark.parametrize(
    "endpoint, body, choices",
    [
        ("/v1/chat/completions", {**ASK, "max_tokens": 6, "n": 3}, 3),
        (
            "/v1/completions",
            {"model": "gpt-4o-mini", "prompt": "Say hi.", "max_tokens": 6, "n": 2, "best_of": 4},
            4,
        ),
    ],
    ids=["chat-n", "completions-best_of"],
)
async def test_every_choice_the_api_bills_is_in_the_row_and_the_keys_spend(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, endpoint: str, body: Any, choices: int
) -> None:
    # The fake bills each choice (each of best_of), as OpenAI does: six words a choice.
    fake_api.set(reply="one two three four five six")
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "many", monthly_budget_pusd=10**12)
    auth = {"authorization": f"Bearer {key}", **API}
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        response = await client.post(endpoint, json=body, headers=auth)
        await asyncio.sleep(0.3)  # the settle runs in the background
        assert await services_of(client).ledger.flush(10)
    assert response.status_code == 200, response.text[:300]
    assert response.json()["usage"]["completion_tokens"] == 6 * choices
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        [(tokens, cost)] = conn.execute(
            "SELECT completion_tokens, api_cost_pusd FROM requests"
        ).fetchall()
    finally:
        conn.close()
    spent, reserved = spend(db, "many")
    assert tokens == 6 * choices and cost > 0
    assert spent == cost and reserved == 0


# -- issue 39: prices by tier, audio and web search ------------------------------------------------


async def test_a_priority_call_with_audio_is_reserved_and_charged_at_its_own_rates(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    # gpt-4o-mini at priority ($0.25/M in, $1/M out), not its standard $0.15/M and $0.60/M;
    # of the tokens the fake bills, 1 prompt and 4 completion tokens are audio, priced at the
    # bound (the map gives gpt-4o-mini no audio rate), never as text.
    audio = {
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 1},
        "completion_tokens_details": {"audio_tokens": 4},
    }
    fake_api.set(reply="one two three four five six", usage=audio)
    book = PriceBook(load_price_map())
    body = {**ASK, "max_tokens": 6, "service_tier": "priority"}
    prompt, completion = worst_case_tokens(
        body, book.max_output_tokens("gpt-4o-mini"), book.max_input_tokens("gpt-4o-mini")
    )
    standard = book.cost("gpt-4o-mini", prompt, completion)
    priority = book.cost("gpt-4o-mini", prompt, completion, billed=Billed(tier="priority"))
    assert standard is not None and priority is not None and priority > standard
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "fast", monthly_budget_pusd=10**12)
    tight = keys.create(db, "tight", monthly_budget_pusd=(standard + priority) // 2)
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        refused = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tight}", **API}
        )
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **API}
        )
        await asyncio.sleep(0.3)  # the settle runs in the background
        assert await services_of(client).ledger.flush(10)
    assert refused.status_code == 429, refused.text[:300]  # the standard worst case would fit
    assert response.status_code == 200, response.text[:300]
    assert fake_api.requests[-1][2]["service_tier"] == "priority"  # forwarded as asked
    usage = response.json()["usage"]
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        [row] = conn.execute(
            "SELECT service_tier, audio_prompt_tokens, audio_completion_tokens, api_cost_pusd, "
            "counterfactual_cost_pusd FROM requests WHERE status = 200"
        ).fetchall()
    finally:
        conn.close()
    price = book.price("gpt-4o-mini", "priority")
    assert price is not None and price.input == 250_000
    text_in, text_out = usage["prompt_tokens"] - 1, usage["completion_tokens"] - 4
    expected = (
        text_in * price.input
        + text_out * price.output
        + 1 * AUDIO_INPUT_BOUND
        + 4 * AUDIO_OUTPUT_BOUND
    )
    assert text_in > 0 and row == ("priority", 1, 4, expected, expected)
    assert spend(db, "fast") == (expected, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_tier_the_provider_says_it_served_is_the_one_charged(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, stream: bool
) -> None:
    # Asked for priority, served (and billed) at the default tier, as OpenAI's answer says when
    # it does not grant priority: the row and the key's spend are at the standard rate.
    fake_api.set(reply="one two three four five six", served_tier="default")
    book = PriceBook(load_price_map())
    body = {**ASK, "max_tokens": 6, "service_tier": "priority", "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "asked", monthly_budget_pusd=10**12)
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **API}
        )
        await asyncio.sleep(0.3)  # the settle runs in the background
        assert await services_of(client).ledger.flush(10)
    assert response.status_code == 200, response.text[:300]
    assert fake_api.requests[-1][2]["service_tier"] == "priority"
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        [(tier, prompt, completion, cost)] = conn.execute(
            "SELECT service_tier, prompt_tokens, completion_tokens, api_cost_pusd FROM requests"
        ).fetchall()
    finally:
        conn.close()
    standard = book.cost("gpt-4o-mini", prompt, completion)
    assert completion == 6 and standard is not None
    assert standard < (
        book.cost("gpt-4o-mini", prompt, completion, billed=Billed(tier="priority")) or 0
    )
    assert (tier, cost) == (None, standard)
    assert spend(db, "asked") == (standard, 0)


async def test_an_input_audio_part_is_reserved_at_an_audio_rate_not_as_text(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    # One input_audio part is reserved a whole input window (128,000 tokens for gpt-4o-mini):
    # $0.0192 as text, $12.80 at the audio bound ($100/M; the map gives gpt-4o-mini no audio
    # rate). A $1 budget holds the text price, not the audio one.
    said = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    content = [{"type": "text", "text": "What is said?"}, said]
    body = {**ASK, "max_tokens": 6, "messages": [{"role": "user", "content": content}]}
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "listener", monthly_budget_pusd=10**12)
    async with make_client(ledger_settings(tmp_path, fake_api, db)) as client:
        refused = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **API}
        )
    assert refused.status_code == 429, refused.text[:300]
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert "$12.8" in refused.json()["error"]["message"]
    assert fake_api.count == 0
