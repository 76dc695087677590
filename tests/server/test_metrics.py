"""``GET /metrics``: Prometheus text from a real ``frugal serve``, and per-app registries."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database, from_settings
from proxy.ledger.db.location import parse as parse_db
from proxy.ledger.db.migrate import open_database
from proxy.routing.reasons import Reason
from proxy.serving.batch_gauges import BatchGauges
from proxy.serving.metrics import Metrics
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.ledger.test_batch_store import batch_of
from tests.server.test_serve import ACCEPT_ANY, REJECT_ALL, Served, start_server, stop_server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


CHAT = {"endpoint": "chat.completions"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with FakeAPI(reply="The capital of France is Paris.") as api:
        server = start_server(tmp_path_factory.mktemp("metrics"), api)
        yield server
        assert stop_server(server) == 0


@pytest.mark.serve
def test_metrics_count_requests_tokens_latency_money_engine_and_ledger(served: Served) -> None:
    local = served.chat(headers=ACCEPT_ANY).parse()
    fallback = served.chat(headers=REJECT_ALL).parse()
    with pytest.raises(openai.BadRequestError):
        served.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], temperature=5
        )
    deadline = time.monotonic() + 10
    while True:  # the ledger writes off the request path
        response = httpx.get(served.base + "/metrics", timeout=5)
        samples = parse(response.text)
        if value(samples, "frugal_ledger_rows_written_total") >= 3:
            break
        assert time.monotonic() < deadline, "the ledger rows never showed up"
        time.sleep(0.1)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")

    def requests(route: str, reason: str, status: str) -> float:
        labels = {**CHAT, "route": route, "reason": reason, "status": status}
        return value(samples, "frugal_requests_total", **labels)

    assert requests("local", "accepted", "200") == 1
    assert requests("api", "low_quality", "200") == 1
    assert requests("none", "bad_request", "400") == 1
    labelled = {
        dict(labels)["reason"] for name, labels in samples if name == "frugal_requests_total"
    }
    assert labelled == {"accepted", "low_quality", "bad_request"}
    assert labelled <= {reason.value for reason in Reason}  # the label's values are the enum's

    for route in ("local", "api"):
        labels = {**CHAT, "route": route}
        assert value(samples, "frugal_request_duration_seconds_count", **labels) == 1
        assert value(samples, "frugal_request_duration_seconds_sum", **labels) > 0
        assert value(samples, "frugal_request_duration_seconds_bucket", **labels, le="+Inf") == 1
    assert local.usage is not None and fallback.usage is not None
    assert value(samples, "frugal_tokens_total", route="local", kind="prompt") == (
        local.usage.prompt_tokens
    )
    assert value(samples, "frugal_tokens_total", route="local", kind="completion") == (
        local.usage.completion_tokens
    )
    assert value(samples, "frugal_tokens_total", route="api", kind="completion") == (
        fallback.usage.completion_tokens
    )
    # the rejected local attempt's work is counted too
    assert value(samples, "frugal_local_tokens_total", kind="completion") > (
        local.usage.completion_tokens
    )
    assert value(samples, "frugal_quality_score_count", route="local") == 1
    assert value(samples, "frugal_quality_score_count", route="api") == 1

    counterfactual = value(samples, "frugal_counterfactual_cost_usd_total")
    paid = value(samples, "frugal_api_cost_usd_total")
    saved = value(samples, "frugal_saved_usd_total")
    assert counterfactual > paid > 0
    assert saved == pytest.approx(counterfactual - paid)

    assert value(samples, "frugal_engine_up") == 1
    assert value(samples, "frugal_engine_queue_depth") == 0
    assert value(samples, "frugal_engine_max_queue") == 16
    assert value(samples, "frugal_engine_decode_tokens_per_second") > 0
    assert value(samples, "frugal_engine_prefill_tokens_per_second") > 0
    assert value(samples, "frugal_engine_completed_total") >= 2
    assert ("frugal_ledger_write_failures_total", frozenset()) in samples
    assert value(samples, "frugal_ledger_write_failures_total") == 0
    assert value(samples, "frugal_in_flight_requests") == 0


@pytest.mark.serve
def test_metrics_are_open_on_a_server_without_keys(served: Served) -> None:
    assert httpx.get(served.base + "/metrics", timeout=5).status_code == 200


# -- in-process ---------------------------------------------------------------------------------


async def test_each_app_has_its_own_registry(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with make_client(settings) as one, make_client(settings) as two:
        sent = await one.post("/v1/chat/completions", json=body, headers={"x-frugal-route": "api"})
        assert sent.status_code == 200
        first = parse((await one.get("/metrics")).text)
        second = parse((await two.get("/metrics")).text)
    labels = {**CHAT, "route": "api", "reason": "forced", "status": "200"}
    assert value(first, "frugal_requests_total", **labels) == 1
    assert value(second, "frugal_requests_total", **labels) == 0


async def test_metrics_open_serves_metrics_without_a_key_even_with_keys(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # scraper: an admin key; app: a client key, which reads /metrics only when they are open.
    monkeypatch.setenv("FRUGAL_TEST_METRICS_KEYS", f"scraper;admin:{'s' * 24},app:{'a' * 24}")
    for metrics_open, status, client_status in ((False, 401, 403), (True, 200, 200)):
        server = {"api_keys_env": "FRUGAL_TEST_METRICS_KEYS", "metrics_open": metrics_open}
        settings = settings_for(tmp_path, fake_api, server=server)
        async with make_client(settings) as client:
            assert (await client.get("/metrics")).status_code == status
            scraped = await client.get("/metrics", headers={"authorization": "Bearer " + "s" * 24})
            assert scraped.status_code == 200
            by_app = await client.get("/metrics", headers={"authorization": "Bearer " + "a" * 24})
            assert by_app.status_code == client_status
            assert (await client.get("/v1/models")).status_code == 401


def test_ledger_write_failures_and_drops_come_from_the_ledgers_own_counters() -> None:
    ledger = SimpleNamespace(
        health=lambda: {"written": 5, "write_failures": 3, "dropped": 2, "pending": 7}
    )
    metrics = Metrics(ledger=ledger)  # type: ignore[arg-type]
    samples = parse(metrics.render().decode())
    assert value(samples, "frugal_ledger_write_failures_total") == 3
    assert value(samples, "frugal_ledger_rows_dropped_total") == 2
    assert value(samples, "frugal_ledger_rows_written_total") == 5
    assert value(samples, "frugal_ledger_pending_rows") == 7


def test_money_is_summed_exactly_in_picodollars() -> None:
    metrics = Metrics()

    def answered(route: str, reason: Reason, paid: int, counterfactual: int) -> None:
        metrics.observe(
            endpoint="chat.completions",
            route=route,
            reason=reason,
            status=200,
            latency_s=0.1,
            api_cost_pusd=paid,
            counterfactual_pusd=counterfactual,
        )

    for _ in range(10):
        answered("local", Reason.ACCEPTED, 0, 100_000)  # 1e-7 USD: 0.1 is not exact in binary
    # mapped to a pricier model: nothing saved, nothing subtracted
    answered("api", Reason.LOW_QUALITY, 300_000, 200_000)
    samples = parse(metrics.render().decode())
    assert metrics.counterfactual_pusd == 1_200_000 and metrics.saved_pusd == 1_000_000
    assert value(samples, "frugal_saved_usd_total") == 1e-6
    assert value(samples, "frugal_api_cost_usd_total") == 3e-7


def _ledger(db: Database) -> Pool:
    """A pool on the ledger ``db``, its schema in place."""
    open_database(db)
    return Pool(db, size=2)


async def test_batch_gauges_count_open_lines_and_batches_at_most_once_per_max_age(
    tmp_path: Path,
) -> None:
    pool = _ledger(parse_db(str(tmp_path / "ledger.db")))
    first = batch_of(pool, 5, now=time.time())
    store = BatchStore(pool)
    store.cancel(batch_of(pool, 2, now=time.time()))
    clock = [100.0]
    gauges = BatchGauges(pool, max_age_s=5.0, clock=lambda: clock[0])
    metrics = Metrics(batches=gauges)
    assert not any(name.startswith("frugal_batch") for name, _ in parse(metrics.render().decode()))
    await asyncio.gather(*(metrics.fresh() for _ in range(4)))  # four scrapes at once: one read
    samples = parse(metrics.render().decode())
    assert gauges.reads == 1
    assert value(samples, "frugal_batch_lines", state="pending") == 5
    assert value(samples, "frugal_batch_lines", state="claimed") == 0
    assert value(samples, "frugal_batches", status="in_progress") == 1
    assert value(samples, "frugal_batches", status="cancelled") == 1
    assert value(samples, "frugal_batches", status="completed") == 0
    claimed = store.claim("w1", 3, lease_s=60, batch_id=first)
    store.defer_to_api([claimed[0].id], "batch_up")
    clock[0] += 4.9  # within the bound: the last reading is served, the database not read
    await metrics.fresh()
    assert gauges.reads == 1
    assert value(parse(metrics.render().decode()), "frugal_batch_lines", state="pending") == 5
    clock[0] += 0.1  # past it: read again
    await metrics.fresh()
    samples = parse(metrics.render().decode())
    assert gauges.reads == 2
    assert value(samples, "frugal_batch_lines", state="pending") == 2
    assert value(samples, "frugal_batch_lines", state="claimed") == 2
    assert value(samples, "frugal_batch_lines", state="deferred") == 1
    pool.close()


async def test_a_scrape_serves_the_last_reading_while_the_ledger_is_held_locked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    pool = _ledger(parse_db(str(path)))
    first = batch_of(pool, 4, now=time.time())
    clock = [0.0]
    gauges = BatchGauges(pool, max_age_s=5.0, wait_s=0.2, clock=lambda: clock[0])
    metrics = Metrics(batches=gauges)
    await metrics.fresh()
    assert value(parse(metrics.render().decode()), "frugal_batch_lines", state="pending") == 4
    BatchStore(pool).claim("w1", 1, lease_s=60, batch_id=first)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as a backup or a long write would hold it
    clock[0] += 5.0
    started = time.monotonic()
    await metrics.fresh()  # gives up waiting after wait_s; the reading goes on
    print(f"scrape with the ledger locked: {time.monotonic() - started:.3f} s (wait_s 0.2)")
    reading = gauges.reading
    assert reading is not None and gauges.reads == 1
    assert value(parse(metrics.render().decode()), "frugal_batch_lines", state="pending") == 4
    await metrics.fresh()  # a scrape meanwhile shares the reading under way
    assert gauges.reading is reading
    holder.execute("COMMIT")
    holder.close()
    await reading
    samples = parse(metrics.render().decode())
    assert gauges.reads == 2 and gauges.reading is None
    assert value(samples, "frugal_batch_lines", state="pending") == 3
    assert value(samples, "frugal_batch_lines", state="claimed") == 1
    pool.close()


async def test_a_served_apps_metrics_show_the_batches_in_its_ledger(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api)
    pool = _ledger(from_settings(settings.ledger))
    first = batch_of(pool, 3, now=time.time())
    # Its lines held by another replica for longer than the test: the app's own batch runner
    # (started by the lifespan) has nothing to claim, so the figures cannot move under it.
    BatchStore(pool).claim("replica-2", 3, lease_s=3600, batch_id=first)
    pool.close()
    async with make_client(settings) as client:
        samples = parse((await client.get("/metrics")).text)
    assert value(samples, "frugal_batch_lines", state="claimed") == 3
    assert value(samples, "frugal_batch_lines", state="pending") == 0
    assert value(samples, "frugal_batches", status="in_progress") == 1
