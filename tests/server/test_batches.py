"""``/v1/batches`` against the in-process app, with the official ``openai`` SDK: create, read,
list and cancel; a bad input file gives a ``failed`` batch with its ``errors``; each key its own
batches; a bad parameter is a 400 naming it; a batch cancelled or expired mid-way has every
custom_id in exactly one of its two files. (The lines are answered by the app's batch runner on
the shared engine; the tests that do not wait for them read the batch before its lines end.)"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.engine.fair_queue import KEYLESS
from proxy.engine.local_engine import LocalEngine
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.in_process import in_process
from tests.server.test_files import (  # noqa: F401 - the fixture
    ALICE,
    BOB,
    CAROL,
    KEYS_ENV,
    LINES,
    app,
)
from tests.server.test_metrics import parse, value
from tests.serving.test_batch_attempt import Seen

ENDPOINT = "/v1/chat/completions"


async def test_a_batch_is_created_read_listed_and_cancelled_through_the_sdk(app: Any) -> None:  # noqa: F811
    async with app() as served:
        client = served.sdk()
        upload = await client.files.create(file=("in.jsonl", LINES), purpose="batch")
        made = await client.batches.create(
            input_file_id=upload.id,
            endpoint=ENDPOINT,
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        assert made.object == "batch" and made.status == "in_progress"
        assert made.input_file_id == upload.id and made.endpoint == ENDPOINT
        assert made.request_counts is not None and made.request_counts.total == 3
        assert made.metadata == {"job": "nightly"}
        assert (await client.batches.retrieve(made.id)).id == made.id
        second = await client.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        listed = await client.batches.list()
        assert {b.id for b in listed.data} == {made.id, second.id}
        page = await client.batches.list(limit=1)
        assert len(page.data) == 1 and page.has_more
        rest = await client.batches.list(limit=1, after=page.data[0].id)
        assert len(rest.data) == 1 and not rest.has_more
        cancelled = await client.batches.cancel(made.id)
        assert cancelled.status in ("cancelling", "cancelled")
        assert (await client.batches.retrieve(made.id)).status == cancelled.status
        assert (await client.batches.retrieve(second.id)).status == "in_progress"


async def test_a_bad_input_file_gives_a_failed_batch_with_its_errors(app: Any) -> None:  # noqa: F811
    bad = LINES + b"not json\n" + json.dumps({"custom_id": "x", "method": "GET"}).encode() + b"\n"
    async with app() as served:
        client = served.sdk()
        upload = await client.files.create(file=("bad.jsonl", bad), purpose="batch")
        made = await client.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        assert made.status == "failed"
        assert made.errors is not None and made.errors.data
        assert [(e.line, e.code) for e in made.errors.data] == [
            (4, "invalid_json_line"),
            (5, "invalid_value"),
        ]
        assert made.request_counts is not None and made.request_counts.total == 0


async def test_another_keys_batch_is_a_404_and_an_admin_sees_it(app: Any) -> None:  # noqa: F811
    async with app(keys=True) as served:
        bob, carol, alice = served.sdk(BOB), served.sdk(CAROL), served.sdk(ALICE)
        upload = await bob.files.create(file=("in.jsonl", LINES), purpose="batch")
        with pytest.raises(openai.NotFoundError) as not_hers:
            await carol.batches.create(
                input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
            )
        assert not_hers.value.body["param"] == "input_file_id"  # type: ignore[index]
        made = await bob.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        for call in (carol.batches.retrieve, carol.batches.cancel):
            with pytest.raises(openai.NotFoundError) as hidden:
                await call(made.id)
            assert hidden.value.body["param"] == "batch_id"  # type: ignore[index]
        assert (await carol.batches.list()).data == []
        assert (await bob.batches.retrieve(made.id)).status == "in_progress"
        assert [b.id for b in (await alice.batches.list()).data] == [made.id]
        assert (await alice.batches.retrieve(made.id)).id == made.id


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": ENDPOINT, "completion_window": "24h"}, "input_file_id"),
        (
            {"input_file_id": "FILE", "endpoint": "/v1/images", "completion_window": "24h"},
            "endpoint",
        ),
        (
            {"input_file_id": "FILE", "endpoint": ENDPOINT, "completion_window": "1h"},
            "completion_window",
        ),
        ({"input_file_id": "FILE", "endpoint": ENDPOINT}, "completion_window"),
        (
            {"input_file_id": "file-nothere", "endpoint": ENDPOINT, "completion_window": "24h"},
            "input_file_id",
        ),
        (
            {
                "input_file_id": "FILE",
                "endpoint": ENDPOINT,
                "completion_window": "24h",
                "colour": 1,
            },
            "colour",
        ),
        (
            {
                "input_file_id": "FILE",
                "endpoint": ENDPOINT,
                "completion_window": "24h",
                "metadata": 5,
            },
            "metadata",
        ),
    ],
)
async def test_a_bad_create_parameter_is_named(app: Any, body: dict[str, Any], param: str) -> None:  # noqa: F811
    async with app() as served:
        upload = await served.sdk().files.create(file=("in.jsonl", LINES), purpose="batch")
        if body.get("input_file_id") == "FILE":
            body = {**body, "input_file_id": upload.id}
        answer = await served.http.post("http://localhost/v1/batches", json=body)
        assert answer.status_code in (400, 404), answer.text
        assert answer.json()["error"]["param"] == param
        assert (await served.sdk().batches.list()).data == []


async def test_bad_list_parameters_and_unknown_ids(app: Any) -> None:  # noqa: F811
    async with app() as served:
        for query in ("limit=0", "limit=101", "limit=x"):
            answer = await served.http.get(f"http://localhost/v1/batches?{query}")
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit"
        after = await served.http.get("http://localhost/v1/batches?after=batch_nothere")
        assert after.status_code == 400 and after.json()["error"]["param"] == "after"
        for method, path in (
            ("GET", "/v1/batches/batch_x"),
            ("POST", "/v1/batches/batch_x/cancel"),
        ):
            answer = await served.http.request(method, f"http://localhost{path}")
            assert answer.status_code == 404 and answer.json()["error"]["param"] == "batch_id"


def _lines(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"task-{i}",
                "method": "POST",
                "url": ENDPOINT,
                "body": {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": f"Say hi {i}"}],
                    "max_tokens": 4,
                },
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


async def _until(client: openai.AsyncOpenAI, batch_id: str, done: Any) -> Any:
    """The batch, polled until ``done(batch)`` (a minute at most)."""
    for _ in range(1200):
        batch = await client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError(f"the batch never got there: {batch.status} {batch.request_counts}")


async def _files(client: openai.AsyncOpenAI, batch: Any) -> tuple[list[Any], list[Any]]:
    """The batch's output and error files, each read as its lines."""
    found: list[list[Any]] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is None:
            found.append([])
            continue
        text = (await client.files.content(file_id)).text
        found.append([json.loads(line) for line in text.splitlines()])
    return found[0], found[1]


@pytest.mark.parametrize("end", ["cancelled", "expired"])
async def test_a_batch_ended_mid_way_has_every_custom_id_in_exactly_one_file(
    app: Any,  # noqa: F811
    end: str,
) -> None:
    """Cancelled (or expired) once a line is answered: the lines never answered are in the error
    file with OpenAI's code (``batch_cancelled``, ``batch_expired``), every custom_id is in
    exactly one of the two files, and ``request_counts`` count what the files hold."""
    total = 30
    async with app(local={"parallel": 1}, quality={"threshold": 0.0}) as served:
        client = served.sdk()
        upload = await client.files.create(file=("in.jsonl", _lines(total)), purpose="batch")
        made = await client.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        await _until(client, made.id, lambda b: b.request_counts.completed >= 1)
        if end == "cancelled":
            await client.batches.cancel(made.id)
        else:  # the window passed: the sweep the app runs every minute, a day later
            state = served.http.app.state.services.batches
            await state.call(state.batches.expire, now=time.time() + 25 * 3600)
        batch = await _until(client, made.id, lambda b: b.status == end)
        output, errors = await _files(client, batch)
    ids = [line["custom_id"] for line in output + errors]
    assert sorted(ids) == sorted(f"task-{i}" for i in range(total))  # each once
    assert output and all(line["response"]["status_code"] == 200 for line in output)
    code = "batch_cancelled" if end == "cancelled" else "batch_expired"
    assert errors and {line["error"]["code"] for line in errors} == {code}
    assert all(line["response"] is None for line in errors)
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (total, len(output), len(errors))
    print(f"{end}: {len(output)} answered, {len(errors)} {code}")


def _chat_line(i: int, content: Any) -> dict[str, Any]:
    return {
        "custom_id": f"task-{i}",
        "method": "POST",
        "url": ENDPOINT,
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
        },
    }


async def _scrape(served: Any) -> Any:
    return parse((await served.http.get("http://localhost/metrics")).text)


async def _scrape_until(served: Any, seen: Any) -> Any:
    """/metrics scraped until ``seen(samples)`` (a minute at most)."""
    for _ in range(3000):
        samples = await _scrape(served)
        if seen(samples):
            return samples
        await asyncio.sleep(0.02)
    raise AssertionError("/metrics never showed it")


def _runner(samples: Any) -> tuple[float, float, float]:
    return (
        value(samples, "frugal_batch_runner_lines", state="running"),
        value(samples, "frugal_batch_runner_lines", state="held"),
        value(samples, "frugal_batch_runner_lines", state="upstream"),
    )


async def test_metrics_show_the_lines_the_runner_runs_holds_and_has_with_the_upstream(
    app: Any,  # noqa: F811
    fake_api: FakeAPI,
) -> None:
    """A batch whose first line has an image (the local model cannot serve it: held for the
    upstream) and whose other lines run locally one at a time: /metrics shows one line running
    and one held, then the held one with the upstream's batch (which the fake keeps
    ``in_progress``), then, once the batch is cancelled, none; the lines finished locally are
    counted by route."""
    image = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    local = 6
    lines = [_chat_line(0, image)] + [_chat_line(i, f"Say hi {i}") for i in range(1, local + 1)]
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    fake_api.set(batch_polls=10**6)  # the upstream's batch never ends by itself
    sections = {
        "local": {"parallel": 1},
        "quality": {"threshold": 0.0},
        "batch": {"poll_interval_s": 0.05, "max_poll_interval_s": 0.1},
    }
    async with app(**sections) as served:
        client = served.sdk()
        before = await _scrape(served)
        assert _runner(before) == (0, 0, 0)
        upload = await client.files.create(file=("in.jsonl", content), purpose="batch")
        made = await client.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        await _scrape_until(served, lambda s: _runner(s) == (1, 1, 0))
        sent = await _scrape_until(served, lambda s: _runner(s)[2] == 1)
        assert _runner(sent) == (0, 0, 1)
        assert value(sent, "frugal_batch_runner_lines_finished_total", route="local") == local
        assert value(sent, "frugal_batch_runner_lines_finished_total", route="api") == 0
        await client.batches.cancel(made.id)
        batch = await _until(client, made.id, lambda b: b.status == "cancelled")
        after = await _scrape_until(served, lambda s: _runner(s) == (0, 0, 0))
    assert value(after, "frugal_batch_runner_lines_finished_total", route="local") == local
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (local + 1, local, 1)
    assert [path for path, _, _ in fake_api.requests if path.endswith("/cancel")]


async def test_a_batch_line_runs_in_its_keys_share_and_is_offered_to_the_shadow_audits(
    tmp_path: Path, fake_api: FakeAPI, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's batch lines wait in Bob's share of the local queue, as his interactive request
    does (not the keyless one), and each line's local answer, kept or refused by the gate
    (``gpt-4o`` has the bar 1), is offered to the shadow audits as an interactive answer is:
    with ``[audit] rate = 1`` each gets its shadow call, under its line id."""
    monkeypatch.setenv(KEYS_ENV, f"alice;admin:{ALICE},bob:{BOB},carol:{CAROL}")
    settings = settings_for(
        tmp_path,
        fake_api,
        server={"api_keys_env": KEYS_ENV},
        local={"parallel": 1},
        quality={"threshold": 0.0, "models": {"gpt-4o": 1.0}},
        audit={"rate": 1.0},
        batch={"poll_interval_s": 0.05, "max_poll_interval_s": 0.1},
    )
    refused = json.loads(_lines(3).splitlines()[2])
    refused["body"]["model"] = "gpt-4o"
    content = b"".join(_lines(3).splitlines(keepends=True)[:2]) + json.dumps(refused).encode()
    shares = Seen(engine)
    async with in_process(settings, shares) as http:
        bob = openai.AsyncOpenAI(
            api_key=BOB, base_url="http://localhost/v1", http_client=http, max_retries=0
        )
        asked = await bob.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
        )
        assert asked.headers["x-frugal-route"] == "local"
        [(own_share, interactive)] = [(a.share, a.priority) for a, _ in shares.asks]
        upload = await bob.files.create(file=("in.jsonl", content), purpose="batch")
        made = await bob.batches.create(
            input_file_id=upload.id, endpoint=ENDPOINT, completion_window="24h"
        )
        batch = await _until(bob, made.id, lambda b: b.status == "completed")
        output, errors = await _files(bob, batch)
        lines = {line["id"] for line in output}
        for _ in range(600):  # the audits run in the background
            audited = {
                headers.get("x-request-id", "").removesuffix(".audit")
                for _, headers, _ in fake_api.requests
                if headers.get("x-request-id", "").endswith(".audit")
            }
            if lines <= audited:
                break
            await asyncio.sleep(0.05)
    asked_as = [(a.share, a.priority) for a, _ in shares.asks]
    print("shares", asked_as, "audited", sorted(audited))
    assert own_share != KEYLESS and interactive == "interactive"
    assert len(output) == 3 and errors == []
    assert asked_as[1:] == [(own_share, "deferred")] * 3
    assert lines <= audited  # each line's shadow call, under its line id
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        kept = dict(db.execute("SELECT request_id, accepted FROM audits").fetchall())
    by_custom_id = {line["custom_id"]: kept.get(line["id"]) for line in output}
    assert by_custom_id == {"task-0": 1, "task-1": 1, "task-2": 0}  # the gate's verdicts
