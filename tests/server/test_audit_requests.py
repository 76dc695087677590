"""Shadow audits on the request path: the real app, the real SmolLM2, the fake API behind a real
loopback judge server (``tests/audit/judge_server.py``, which judges the judge calls and relays
every other request to the fake API), and the real SQLite ledger.

A request's own answer never waits for its audit: the tests hold the shadow call (or the
judge) back at the judge server and see the client's response arrive while ``/healthz`` still
counts the audit as pending. Nothing here is timed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from proxy.engine.local_engine import LocalEngine
from proxy.ledger.audits.audit_record import AuditRecord, insert
from proxy.ledger.audits.threshold import ACCEPT_NOTHING
from proxy.ledger.db.location import parse
from proxy.ledger.db.migrate import open_database
from proxy.ledger.tenants import keys
from proxy.ledger.tenants.budgets import month_of
from proxy.serving.services import Services
from tests.audit.judge_server import JudgeServer
from tests.conftest import settings_for
from tests.fake_api import FakeAPI

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPLY = "Paris is the capital of France."
ASK = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 8,
}
ACCEPT = {"x-frugal-min-quality": "0"}  # any scored answer is accepted
REJECT = {"x-frugal-min-quality": "1"}  # no answer scores 1: every one falls back


@pytest.fixture
def judge(fake_api: FakeAPI) -> Iterator[JudgeServer]:
    fake_api.set(reply=REPLY)
    server = JudgeServer(relay_to=fake_api.url).start()
    yield server
    server.stop()


def audit_settings(
    tmp_path: Path, api: FakeAPI, judge: JudgeServer, target: float = 0.0, **audit: Any
) -> Any:
    return settings_for(
        tmp_path,
        api,
        fallback={"api_base": judge.url},
        audit={"rate": 1.0, **audit},
        quality={"target_precision": target},
        pricing={"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}},
    )


def services(client: httpx.AsyncClient) -> Services:
    found: Services = client.app.state.services  # type: ignore[attr-defined]
    return found


async def settle(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Wait for the audits in flight, write the ledger, and read the audits table."""
    s = services(client)
    assert s.audit is not None
    assert await s.audit.sampler.drain(60) == 0
    assert await s.ledger.flush(10)
    conn = sqlite3.connect(s.settings.ledger.path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM audits ORDER BY id")]
    finally:
        conn.close()


async def audit_health(client: httpx.AsyncClient) -> dict[str, Any]:
    health = (await client.get("/healthz")).json()
    block: dict[str, Any] = health["audit"]
    return block


@pytest.mark.parametrize("stream", [False, True])
async def test_an_accepted_answer_is_sent_before_its_shadow_call_is_answered(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any, stream: bool
) -> None:
    async with make_client(audit_settings(tmp_path, fake_api, judge)) as client:
        judge.hold("relay")  # the shadow call reaches the judge server and waits there
        body = {**ASK, "stream": stream}
        response = await client.post("/v1/chat/completions", json=body, headers=ACCEPT)
        assert response.status_code == 200
        assert response.headers["x-frugal-route"] == "local"
        assert response.headers["x-frugal-reason"] == "accepted"
        health = await audit_health(client)
        assert health["pending"] == 1  # the client has its answer; the audit is still running
        assert health["audited"] == 1
        judge.release("relay")
        rows = await settle(client)
        assert (await audit_health(client))["pending"] == 0

    [row] = rows
    assert row["request_id"] == response.headers["x-request-id"]
    assert row["accepted"] == 1
    assert row["weight"] == 1.0
    assert row["verdict"] in (0, 1)
    assert row["method"] in ("exact", "judge")
    assert row["cost_pusd"] > 0  # the shadow call, at least, was paid for
    assert row["score"] == pytest.approx(float(response.headers["x-frugal-quality"]), abs=1e-3)
    assert row["threshold"] == 0.0
    features = json.loads(row["features"])
    assert features and all(isinstance(v, float) for v in features.values())
    assert row["task_kind"] in {*(k[5:] for k in features if k.startswith("task_")), "other"}
    # No text without [server] log_content.
    assert (row["prompt"], row["reference"], row["candidate"], row["judge_reason"]) == (None,) * 4
    # The shadow call: the client's request, not streamed, with its own request id.
    [shadow] = [(h, b) for path, h, b in fake_api.requests if path.endswith("/chat/completions")]
    assert shadow[0]["x-request-id"] == response.headers["x-request-id"] + ".audit"
    assert shadow[1]["messages"] == ASK["messages"] and not shadow[1].get("stream")


async def test_a_rejected_answer_is_graded_against_the_api_answer_without_a_shadow_call(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any
) -> None:
    async with make_client(audit_settings(tmp_path, fake_api, judge)) as client:
        response = await client.post("/v1/chat/completions", json=ASK, headers=REJECT)
        assert response.status_code == 200
        assert response.headers["x-frugal-route"] == "api"
        assert response.json()["choices"][0]["message"]["content"] == REPLY
        rows = await settle(client)

    assert fake_api.count == 1  # the client's own fallback call, and no other
    [row] = rows
    assert row["accepted"] == 0 and row["verdict"] in (0, 1)
    if row["method"] == "judge":
        [case] = judge.requests
        assert case["response_format"]["json_schema"]["name"] == "frugal_verdict"
        assert '"reference": "Paris is the capital of France."' in case["messages"][-1]["content"]
        assert row["cost_pusd"] > 0 and row["judge_model"] == "gpt-4o-mini"
    else:
        assert row["cost_pusd"] == 0 and not judge.requests


@pytest.mark.parametrize(
    ("mode", "error"), [("garbage", "judge_garbage"), ("status", "judge_transport")]
)
async def test_a_judge_that_gives_no_verdict_fails_the_audit_never_counts_it_correct(
    tmp_path: Path,
    fake_api: FakeAPI,
    judge: JudgeServer,
    make_client: Any,
    mode: str,
    error: str,
) -> None:
    fake_api.set(reply="Lyon, obviously, is what I would say.")  # the exact check cannot settle
    judge.mode = mode
    async with make_client(audit_settings(tmp_path, fake_api, judge)) as client:
        response = await client.post("/v1/chat/completions", json=ASK, headers=ACCEPT)
        assert response.status_code == 200
        rows = await settle(client)
        health = await audit_health(client)

    [row] = rows
    assert row["verdict"] is None
    assert row["error"] == error
    assert row["method"] == "judge"
    assert health["failed"] == 1 and health["verdicts"] == {"correct": 0, "wrong": 0}


async def test_a_spent_budget_stops_audits_says_so_once_and_never_fails_a_request(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any
) -> None:
    settings = audit_settings(tmp_path, fake_api, judge, monthly_budget_usd=0.000001)
    async with make_client(settings) as client:
        first = await client.post("/v1/chat/completions", json=ASK, headers=ACCEPT)
        assert first.status_code == 200
        [row] = await settle(client)
        assert row["cost_pusd"] >= 10**6  # one audit spent the whole budget
        with capture_logs() as logs:
            for _ in range(2):
                later = await client.post("/v1/chat/completions", json=ASK, headers=ACCEPT)
                assert later.status_code == 200
        health = await audit_health(client)
        assert len(await settle(client)) == 1  # no other audit

    assert health["state"] == "budget_spent"
    assert health["skipped"]["budget_spent"] == 2
    stops = [e for e in logs if e["event"] == "audit_budget_spent"]
    assert len(stops) <= 1  # logged once: when the spend crossed it, or at the first skip


def seed(path: Path, model: str, graded: list[tuple[float, bool]]) -> None:
    """Audits of accepted local answers of ``model``, a minute old, in the ledger at ``path``:
    for each, its score and whether the judge found it right."""
    now = time.time()
    records = [
        AuditRecord(
            accepted=True,
            verdict=right,
            score=score,
            ts=now - 60,
            local_model=model,
            request_id=f"seed-{i}",
        )
        for i, (score, right) in enumerate(graded)
    ]
    db = parse(str(path))
    open_database(db)
    conn = sqlite3.connect(path)
    try:
        with conn:
            insert(conn, records, log_content=False)
    finally:
        conn.close()


@pytest.fixture
def audited_app(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any, engine: LocalEngine
) -> Callable[[list[tuple[float, bool]]], Any]:
    """The app with a target precision of 0.9 and no new audits, on a ledger seeded with the
    given audits of the local model's answers (see :func:`seed`)."""
    model = str(engine.health().get("model") or "")

    def open_(graded: list[tuple[float, bool]]) -> Any:
        seed(tmp_path / "ledger.db", model, graded)
        return make_client(audit_settings(tmp_path, fake_api, judge, target=0.9, rate=0.0))

    return open_


async def test_a_target_precision_puts_the_threshold_the_audits_support_in_force(
    audited_app: Callable[[list[tuple[float, bool]]], Any],
) -> None:
    # Answers scoring 0.5 and up were right, those below were wrong.
    scores = [0.3 + 0.01 * i for i in range(60)]
    async with audited_app([(score, score >= 0.5) for score in scores]) as client:
        force = (await client.get("/healthz")).json()["threshold_in_force"]
    assert force["source"] == "target"
    assert force["value"] == pytest.approx(0.5)
    assert "target precision 0.9" in force["why"]


async def test_an_unreachable_target_accepts_nothing_and_says_why(
    audited_app: Callable[[list[tuple[float, bool]]], Any],
) -> None:
    async with audited_app([(0.5 + 0.004 * i, i % 2 == 0) for i in range(100)]) as client:
        force = (await client.get("/healthz")).json()["threshold_in_force"]
        response = await client.post("/v1/chat/completions", json=ASK)
    assert force["source"] == "accept_nothing" and force["accepts_nothing"] is True
    assert force["value"] == ACCEPT_NOTHING
    assert "accepting no local answer" in force["why"]
    assert response.status_code == 200
    assert response.headers["x-frugal-route"] == "api"
    assert response.headers["x-frugal-reason"] == "low_quality"


async def _key_spent(client: httpx.AsyncClient, name: str) -> int:
    """The key's spend this month, once the quotas' background writes (the audit's charge, a
    request's settle) are done."""
    quotas = services(client).quotas
    assert quotas is not None
    if quotas._tasks:
        await asyncio.wait(set(quotas._tasks), timeout=10)
    usage = quotas.budgets.usage(month_of(time.time())).get(name)
    return usage.spent_pusd if usage else 0


@pytest.mark.parametrize("route", ["accepted", "rejected"])
async def test_an_audits_cost_counts_against_the_budget_of_the_key_it_was_made_for(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any, route: str
) -> None:
    # A reply the exact check cannot match: the judge is asked, and paid for, every time.
    fake_api.set(reply="Lyon, obviously, is what I would say.")
    settings = audit_settings(tmp_path, fake_api, judge)
    key = keys.create(parse(settings.ledger.path), "audited", monthly_budget_pusd=10**12)
    auth = {"authorization": f"Bearer {key}", **(ACCEPT if route == "accepted" else REJECT)}
    async with make_client(settings) as client:
        response = await client.post("/v1/chat/completions", json=ASK, headers=auth)
        assert response.status_code == 200, response.text
        [audit] = await settle(client)
        spent = await _key_spent(client, "audited")
        conn = sqlite3.connect(settings.ledger.path)
        try:
            [(api_cost,)] = conn.execute("SELECT api_cost_pusd FROM requests").fetchall()
        finally:
            conn.close()

    assert audit["method"] == "judge" and audit["cost_pusd"] > 0
    assert [r["max_tokens"] for r in judge.requests] == [300]  # its worst case is bounded
    if route == "accepted":  # a local answer, a shadow call and a judge call: the audit's
        assert response.headers["x-frugal-route"] == "local" and api_cost == 0
    else:  # the client's own API call, then the judge
        assert response.headers["x-frugal-route"] == "api" and api_cost > 0
    assert spent == api_cost + audit["cost_pusd"]


@pytest.mark.parametrize("refused", ["shadow", "judge"])
async def test_an_audit_call_the_keys_budget_cannot_hold_is_not_made(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any, refused: str
) -> None:
    # The worst cases at gpt-4o-mini's price: the shadow call (ASK's ~150 bytes, 8 output
    # tokens) about $0.00002, the judge (its instructions and the case, ~1 KB, and 300 output
    # tokens) about $0.00025. A $0.000001 budget holds neither; $0.0001 holds the shadow only.
    fake_api.set(reply="Lyon, obviously, is what I would say.")  # not an exact match: a judge
    budget = {"shadow": 10**6, "judge": 10**8}[refused]
    settings = audit_settings(tmp_path, fake_api, judge)
    key = keys.create(parse(settings.ledger.path), "thrifty", monthly_budget_pusd=budget)
    auth = {"authorization": f"Bearer {key}", **ACCEPT}
    async with make_client(settings) as client:
        response = await client.post("/v1/chat/completions", json=ASK, headers=auth)
        assert response.status_code == 200, response.text
        assert response.headers["x-frugal-route"] == "local"
        [audit] = await settle(client)
        spent = await _key_spent(client, "thrifty")
        quotas = services(client).quotas
        assert quotas is not None
        usage = quotas.budgets.usage(month_of(time.time()))["thrifty"]

    assert audit["error"] == "over_budget" and audit["verdict"] is None
    assert judge.requests == []  # the judge was never asked
    assert usage.reserved_pusd == 0  # every hold settled
    if refused == "shadow":
        assert judge.relayed == [] and audit["cost_pusd"] == 0 and spent == 0
    else:  # the shadow call was made and paid for; its cost alone is the key's spend
        assert len(judge.relayed) == 1 and audit["method"] == "judge"
        assert 0 < audit["cost_pusd"] == spent <= budget


async def test_a_local_responses_answer_is_audited_as_its_chat_request(
    tmp_path: Path, fake_api: FakeAPI, judge: JudgeServer, make_client: Any
) -> None:
    """``/v1/responses`` is drawn for the audits too: the shadow call is its chat request."""
    question = ASK["messages"][0]["content"]
    body = {"model": "gpt-4o-mini", "input": question, "max_output_tokens": 8}
    async with make_client(audit_settings(tmp_path, fake_api, judge)) as client:
        response = await client.post("/v1/responses", json=body, headers=ACCEPT)
        assert response.status_code == 200, response.text
        assert response.headers["x-frugal-route"] == "local"
        rows = await settle(client)

    [row] = rows
    assert row["request_id"] == response.headers["x-request-id"]
    assert row["accepted"] == 1 and row["verdict"] in (0, 1)
    assert row["score"] == pytest.approx(float(response.headers["x-frugal-quality"]), abs=1e-3)
    [shadow] = [(h, b) for path, h, b in fake_api.requests if path.endswith("/chat/completions")]
    assert shadow[0]["x-request-id"] == response.headers["x-request-id"] + ".audit"
    assert shadow[1]["messages"] == [{"role": "user", "content": question}]
