"""A batch end to end on a real ``frugal serve`` process (issue 41), driven by the official
``openai`` SDK, the fake API on loopback as the upstream: upload, create, poll to
``completed``, download. The lines run on the real bundled model and its real quality gate
(the batch runner the lifespan starts, proxy/serving/batch_attempt.py); the rejects, and the
lines the local model cannot serve, reach the fake's own Batch API together.

Which lines the gate keeps is the test's choice, through ``[quality.models]``: a line asking for
``gpt-4o-mini`` has the bar 0 (any answer is kept), one asking for ``gpt-4o`` the bar 1 (none
is), as the ``x-frugal-min-quality`` header does for an interactive request (ACCEPT_ANY and
REJECT_ALL in tests/server/test_serve.py).

Covered: a chat batch (kept, refused by the gate, an image, a built-in tool, a bad body), a
legacy completions batch, a Responses batch (with a built-in tool) and an embeddings batch; every
custom_id once in the client's order, ``request_counts``, one upstream batch per client batch
and no single call, one ledger row per line, the API's lines priced at the batch rate; another
key's batch and output file are a 404; a batch cancelled while its upstream batch runs.
(The runner's own logic is tests/serving/test_batch_runner.py; ``kill -9`` mid-batch is a row
of tests/test_faults.py.)"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import openai
import pytest

from proxy.config.load import load
from proxy.ledger.pricing import PriceBook, load_price_map
from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.load_factor import CEILING_S
from tests.server.test_serve import Served, serving

pytestmark = pytest.mark.serve

ALICE = "sk-batch-alice-0123456789abcdef"
BOB = "sk-batch-bob-0123456789abcdef"
KEYS_ENV = "FRUGAL_TEST_BATCH_KEYS"
KEPT, REFUSED = "gpt-4o-mini", "gpt-4o"  # the gate's bar: 0 for the first, 1 for the second
# [audit] rate = 0 as start_server's default, then the sections this test adds.
SECTIONS = f"""rate = 0

[quality.models]
"{KEPT}" = 0.0
"{REFUSED}" = 1.0

[batch]
poll_interval_s = 0.05
max_poll_interval_s = 0.2
"""
QUESTION = "What is the capital of France?"
IMAGE = [
    {"type": "text", "text": QUESTION},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
]
DONE = frozenset({"completed", "failed", "expired", "cancelled"})

REPLY = "The capital of France is Paris."
api = module_api(reply=REPLY)


@pytest.fixture(scope="module")
def served(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        tmp_path_factory.mktemp("batch-serve"),
        api,
        server_toml=f'api_keys_env = "{KEYS_ENV}"',
        env={KEYS_ENV: f"alice;admin:{ALICE},bob:{BOB}"},  # alice reads /healthz in full
        client_key=ALICE,
        router_toml="predictive = false",
        audit_toml=SECTIONS,
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI) -> None:
    api.reset()
    api.set(reply=REPLY)


def chat(model: str, content: Any = QUESTION, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
BATCHES: dict[str, list[dict[str, Any]]] = {
    CHAT: [
        line("chat-kept", CHAT, chat(KEPT)),
        line("chat-refused", CHAT, chat(REFUSED)),
        line("chat-image", CHAT, chat(REFUSED, IMAGE)),
        line("chat-search", CHAT, chat(REFUSED, web_search_options={})),
        line("chat-bad", CHAT, chat(KEPT, temperature=7)),
    ],
    COMPLETIONS: [
        line("text-kept", COMPLETIONS, {"model": KEPT, "prompt": QUESTION, "max_tokens": 12}),
        line("text-refused", COMPLETIONS, {"model": REFUSED, "prompt": QUESTION, "max_tokens": 12}),
    ],
    RESPONSES: [
        line("resp-kept", RESPONSES, {"model": KEPT, "input": QUESTION, "max_output_tokens": 16}),
        line(
            "resp-refused",
            RESPONSES,
            {"model": REFUSED, "input": QUESTION, "max_output_tokens": 16},
        ),
        line(
            "resp-search",
            RESPONSES,
            {"model": REFUSED, "input": QUESTION, "tools": [{"type": "web_search"}]},
        ),
    ],
    EMBEDDINGS: [
        line("embed", EMBEDDINGS, {"model": "text-embedding-3-small", "input": QUESTION}),
    ],
}
LOCAL = {"chat-kept", "chat-bad", "text-kept", "resp-kept"}  # answered here, the rest upstream


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def create(client: openai.OpenAI, url: str, lines: list[dict[str, Any]]) -> Any:
    made = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=made.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]


def settled(read: Callable[[], Any], ends: Collection[str], bound_s: float = CEILING_S) -> Any:
    """What ``read()`` returns once its ``status`` is one of ``ends`` (a generous bound, never a
    timing assertion)."""
    end = time.monotonic() + bound_s
    got = read()
    while got.status not in ends and time.monotonic() < end:
        time.sleep(0.2)
        got = read()
    return got


def finished(client: openai.OpenAI, batch_id: str, bound_s: float) -> Any:
    """The batch once it has ended."""
    return settled(lambda: client.batches.retrieve(batch_id), DONE, bound_s)


def read(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).read().decode().splitlines()]


def ledger_rows(served: Served) -> dict[str, dict[str, Any]]:
    """The ledger's batch rows, by request id (the line's id), once the writer has flushed."""
    with sqlite3.connect(served.db) as db:
        db.row_factory = sqlite3.Row
        found = db.execute(
            "SELECT request_id, endpoint, route, reason, status, requested_model, prompt_tokens, "
            "completion_tokens, api_cost_pusd, counterfactual_cost_pusd, service_tier, "
            "deferred_tier FROM requests WHERE deferred_tier = 'batch'"
        ).fetchall()
    return {row["request_id"]: dict(row) for row in found}


def test_a_mixed_batch_runs_locally_first_and_its_rejects_go_up_as_one_batch(
    served: Served, api: FakeAPI
) -> None:
    client = served.client()
    started = time.monotonic()
    made = {url: create(client, url, lines) for url, lines in BATCHES.items()}
    done = {url: finished(client, b.id, CEILING_S) for url, b in made.items()}
    print(f"\n{sum(map(len, BATCHES.values()))} lines in {time.monotonic() - started:.1f} s")
    outputs: dict[str, dict[str, Any]] = {}
    for url, batch in done.items():
        lines = BATCHES[url]
        assert batch.status == "completed", (url, batch)
        out, errors = read(client, batch.output_file_id), read(client, batch.error_file_id)
        print(url, json.dumps(batch.request_counts.to_dict()), len(out), len(errors))
        ids = [x["custom_id"] for x in out + errors]
        assert sorted(ids) == sorted(x["custom_id"] for x in lines)  # every line once
        assert [x["custom_id"] for x in out] == [  # in the client's order
            x["custom_id"] for x in lines if x["custom_id"] in {y["custom_id"] for y in out}
        ]
        counts = batch.request_counts
        assert counts.total == len(lines) and counts.completed + counts.failed == len(lines)
        assert counts.failed == len(errors)
        for x in out + errors:
            outputs[x["custom_id"]] = x
    # one upstream batch per client batch (each has rejects), no single call
    assert api.batches_made == len(BATCHES) and api.single_calls == 0
    sent = sorted(cid for cid, _, _ in api.batch_lines)
    by_line_id = {x["id"]: cid for cid, x in outputs.items()}
    assert sorted(by_line_id[cid] for cid in sent) == sorted(set(outputs) - LOCAL)
    # the answers: the local model's as the endpoint sends them, the rest the fake's
    assert outputs["chat-kept"]["response"]["body"]["object"] == "chat.completion"
    assert outputs["chat-kept"]["response"]["body"]["model"] == KEPT
    assert outputs["text-kept"]["response"]["body"]["object"] == "text_completion"
    assert outputs["resp-kept"]["response"]["body"]["object"] == "response"
    bad = outputs["chat-bad"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "temperature"
    assert outputs["chat-refused"]["response"]["body"]["choices"][0]["message"]["content"] == REPLY
    # one ledger row per line, at the batch tier; the API's priced at the batch rate
    deadline = time.monotonic() + CEILING_S
    rows = ledger_rows(served)
    while len(rows) < len(outputs) and time.monotonic() < deadline:
        time.sleep(0.2)
        rows = ledger_rows(served)
    assert sorted(rows) == sorted(by_line_id)
    prices = PriceBook.from_settings(load_price_map(), load(str(served.config)).pricing)
    reasons = {}
    for request_id, row in rows.items():
        cid = by_line_id[request_id]
        reasons[cid] = row["reason"]
        assert (row["service_tier"], row["deferred_tier"]) == ("batch", "batch")
        if cid in LOCAL:
            assert row["route"] == "local" and row["api_cost_pusd"] == 0
            continue
        assert row["route"] == "api"
        price = prices.price(row["requested_model"], "batch")
        standard = prices.price(row["requested_model"])
        assert price is not None and standard is not None
        assert price.input < standard.input  # the batch rate, not the standard one
        cost = row["prompt_tokens"] * price.input + (row["completion_tokens"] or 0) * price.output
        assert row["api_cost_pusd"] == cost
    print("reasons", reasons)
    assert reasons["chat-kept"] == reasons["text-kept"] == reasons["resp-kept"] == "accepted"
    assert reasons["chat-bad"] == "bad_request"
    assert reasons["chat-refused"] == reasons["text-refused"] == "low_quality"
    assert reasons["resp-refused"] == "low_quality"
    assert (
        reasons["chat-image"] == reasons["chat-search"] == reasons["resp-search"] == ("unsupported")
    )
    assert reasons["embed"] == "unsupported"


def test_another_keys_batch_and_its_output_are_not_found(served: Served) -> None:
    alice = served.client()
    batch = create(alice, CHAT, [line("mine", CHAT, chat(KEPT))])
    batch = finished(alice, batch.id, CEILING_S)
    assert batch.status == "completed" and batch.output_file_id is not None
    with openai.OpenAI(base_url=served.base + "/v1", api_key=BOB, max_retries=0) as bob:
        with pytest.raises(openai.NotFoundError):
            bob.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            bob.files.content(batch.output_file_id)
        with pytest.raises(openai.NotFoundError):
            bob.batches.cancel(batch.id)
        assert [b.id for b in bob.batches.list().data] == []
    assert len(read(alice, batch.output_file_id)) == 1


def test_a_batch_cancelled_while_its_upstream_batch_runs_is_cancelled_there_too(
    served: Served, api: FakeAPI
) -> None:
    """Every line refused by the gate: they wait in one upstream batch that the fake holds
    ``in_progress``; the client cancels; the upstream batch is cancelled and so is ours, with
    no line answered."""
    api.set(batch_seconds=3600.0)
    client = served.client()
    lines = [line(f"slow-{i}", CHAT, chat(REFUSED, f"{QUESTION} ({i})")) for i in range(3)]
    batch = create(client, CHAT, lines)
    end = time.monotonic() + CEILING_S
    while api.batches_made == 0 and time.monotonic() < end:
        time.sleep(0.2)
    assert api.batches_made == 1
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = finished(client, batch.id, CEILING_S)
    assert batch.status == "cancelled"
    upstream = [b.obj["status"] for b in api.batch_api.batches.values()]
    end = time.monotonic() + CEILING_S
    while upstream != ["cancelled"] and time.monotonic() < end:
        time.sleep(0.2)
        upstream = [b.obj["status"] for b in api.batch_api.batches.values()]
    print("upstream", upstream, "counts", batch.request_counts.to_dict())
    assert upstream == ["cancelled"]
    out, errors = read(client, batch.output_file_id), read(client, batch.error_file_id)
    print("error file", [(x["custom_id"], (x.get("error") or {}).get("code")) for x in errors])
    assert out == []  # no line answered, by the fake or twice
    assert {x["custom_id"] for x in errors} <= {x["custom_id"] for x in lines}
    assert batch.request_counts.completed == 0
    assert api.single_calls == 0


def background_rows(served: Served, count: int) -> list[dict[str, Any]]:
    """The ledger's rows of background responses, once there are ``count`` (a generous bound)."""
    end, found = time.monotonic() + CEILING_S, []
    while len(found) < count and time.monotonic() < end:
        time.sleep(0.2)
        with sqlite3.connect(served.db) as db:
            db.row_factory = sqlite3.Row
            found = db.execute(
                "SELECT route, status, deferred_tier FROM requests "
                "WHERE deferred_tier = 'background' ORDER BY ts"
            ).fetchall()
    return [dict(row) for row in found]


def test_background_responses_are_polled_to_their_end_or_cancelled_on_a_real_server(
    served: Served, api: FakeAPI
) -> None:
    """``background: true`` through the SDK on ``frugal serve``: one the gate keeps, polled from
    ``queued`` to its end (``completed``, or ``incomplete`` when cut by its output limit) with
    no API call; one the gate refuses, whose API call the fake holds, polled while
    ``in_progress`` and then cancelled (the call abandoned). One ledger row each, marked
    background; another key's retrieve and cancel are 404s."""
    alice = served.client()
    kept = alice.responses.create(model=KEPT, input=QUESTION, max_output_tokens=16, background=True)
    assert kept.status in ("queued", "in_progress") and kept.background
    done = settled(
        lambda: alice.responses.retrieve(kept.id),
        ("completed", "incomplete", "failed", "cancelled"),
    )
    # The local answer, whole or cut by max_output_tokens (a local answer the gate keeps).
    assert done.status in ("completed", "incomplete") and done.output_text.strip()
    assert api.count == 0  # answered on the CPU
    api.set(hang=True)
    held = alice.responses.create(
        model=REFUSED, input=QUESTION, max_output_tokens=16, background=True
    )
    running = settled(
        lambda: alice.responses.retrieve(held.id), ("in_progress", "completed", "failed")
    )
    assert running.status == "in_progress"
    end = time.monotonic() + CEILING_S
    while api.count == 0 and time.monotonic() < end:  # the gate refused: the API call is made
        time.sleep(0.1)
    assert api.count == 1
    with openai.OpenAI(base_url=served.base + "/v1", api_key=BOB, max_retries=0) as bob:
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(held.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.cancel(held.id)
    cancelled = alice.responses.cancel(held.id)
    assert (cancelled.id, cancelled.status) == (held.id, "cancelled")
    assert alice.responses.retrieve(held.id).status == "cancelled"
    rows = background_rows(served, 2)
    assert [(row["route"], row["status"]) for row in rows] == [("local", 200), ("api", 499)]
    assert api.count == 1 and api.single_calls == 1
