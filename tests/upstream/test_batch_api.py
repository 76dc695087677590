"""Work that can wait, sent upstream (proxy/upstream/batch_api.py, deferred.py), against the
real fake API on loopback: its Files and Batch APIs (tests/fake_batch.py) driven by the proxy's
client and by the official ``openai`` SDK; the slow, failed and expired batches, a failed line,
a hostile output file; and the flex and sync modes, one call per line."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from proxy.config import BatchSettings, FallbackSettings
from proxy.config.secrets import MARK
from proxy.errors import UpstreamError
from proxy.upstream.batch_api import BatchAPI
from proxy.upstream.client import Upstream
from proxy.upstream.deferred import Deferred, DeferredLine
from tests.conftest import module_api
from tests.fake_api import DEFAULT_REPLY, FakeAPI, usage_for, words

KEY_ENV = "FRUGAL_TEST_BATCH_KEY"
KEY = "sk-test-batch-0123456789"
CHAT_URL = "/v1/chat/completions"

api = module_api()


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api.reset()
    monkeypatch.setenv(KEY_ENV, KEY)


@asynccontextmanager
async def deferred(
    api: FakeAPI,
    models: dict[str, str] | None = None,
    max_answer_bytes: int = 32 * 1024 * 1024,
    **batch: Any,
) -> AsyncIterator[Deferred]:
    fallback = FallbackSettings(
        api_base=api.url,
        api_key_env=KEY_ENV,
        timeout_s=5.0,
        connect_timeout_s=1.0,
        models=models or {},
        max_answer_bytes=max_answer_bytes,
    )
    settings = BatchSettings(**{"poll_interval_s": 0.01, "max_poll_interval_s": 0.05, **batch})
    async with Upstream(fallback, backoff_s=0.01) as upstream:
        yield Deferred(upstream, settings)


def batch_of(sender: Deferred, model: str = "") -> BatchAPI:
    found = sender.api(model)
    assert found is not None
    return found


def chat_line(cid: str, text: str = "What is the capital of France?") -> DeferredLine:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    return DeferredLine(custom_id=cid, url=CHAT_URL, body=body)


def paths(api: FakeAPI, method_path: str) -> int:
    """How many recorded requests went to a path starting with ``method_path``."""
    return sum(1 for r in api.requests if r.path.startswith(method_path))


def expected_usage(line: DeferredLine) -> dict[str, int]:
    return usage_for(line.body, len(words(DEFAULT_REPLY)))


# -- the batch round trip ------------------------------------------------------------------------


async def test_a_batch_goes_up_as_one_file_and_one_batch_and_every_line_comes_back(
    api: FakeAPI,
) -> None:
    lines = [chat_line(f"line-{i}", f"Question number {i}?") for i in range(4)]
    made: list[tuple[str, tuple[str, ...]]] = []

    async def submitted(batch_id: str, ids: tuple[str, ...]) -> None:
        made.append((batch_id, ids))

    async with deferred(api) as sender:
        outcome = await sender.send(lines, request_id="req-1", submitted=submitted)

    assert api.batches_made == 1 and api.single_calls == 0
    assert paths(api, "/v1/files") == 1 + 1  # the upload, then the output file's content
    assert [cid for cid, _, _ in api.batch_lines] == [line.custom_id for line in lines]
    assert made == [(outcome.batches[0]["id"], tuple(line.custom_id for line in lines))]
    assert outcome.unanswered == () and outcome.ignored == 0
    assert outcome.batches[0]["status"] == "completed"
    assert outcome.batches[0]["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    for line in lines:
        result = outcome.results[line.custom_id]
        assert result.ok and result.body["object"] == "chat.completion"
        assert result.body["choices"][0]["message"]["content"] == DEFAULT_REPLY
        assert result.usage == expected_usage(line)


async def test_a_line_goes_up_as_the_interactive_path_would_send_it(api: FakeAPI) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 3,
    }
    async with deferred(api) as sender:
        outcome = await sender.send(
            [DeferredLine(custom_id="a", url=CHAT_URL, body=body)], request_id="r"
        )
    ((_, url, sent),) = api.batch_lines
    assert url == CHAT_URL
    # As the interactive path sends it: the allow-list, and a stream turned off (no options).
    assert sent == {
        "model": "gpt-4o-mini",
        "messages": body["messages"],
        "max_tokens": 3,
        "stream": False,
    }
    assert outcome.results["a"].body["choices"][0]["finish_reason"] == "length"


async def test_lines_of_two_models_or_endpoints_go_as_one_batch_each(api: FakeAPI) -> None:
    other = DeferredLine(
        custom_id="emb",
        url="/v1/embeddings",
        body={"model": "text-embedding-3-small", "input": "x"},
    )
    big = chat_line("big")
    big = DeferredLine(custom_id="big", url=CHAT_URL, body={**big.body, "model": "gpt-4o"})
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a"), other, big, chat_line("b")], request_id="r")
    assert api.batches_made == 3 and api.single_calls == 0
    assert sorted(outcome.results) == ["a", "b", "big", "emb"]
    assert outcome.results["emb"].body["object"] == "list"
    assert outcome.results["emb"].usage == {"prompt_tokens": 1, "total_tokens": 1}


async def test_a_transient_failure_of_the_upload_is_retried_and_makes_one_batch(
    api: FakeAPI,
) -> None:
    api.set(fail_status=503, fail_times=1)
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a"), chat_line("b")], request_id="r")
    uploads = [r for r in api.requests if r.path == "/v1/files"]
    assert len(uploads) == 2 and api.batches_made == 1
    assert sorted(outcome.results) == ["a", "b"] and outcome.unanswered == ()


# -- slow, failed, expired, cancelled ------------------------------------------------------------


async def test_a_slow_batch_is_polled_until_it_ends(api: FakeAPI) -> None:
    api.set(batch_polls=3)
    started = time.monotonic()
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a")], request_id="r")
    print(f"slow batch: {time.monotonic() - started:.3f} s")
    polls = [r for r in api.requests if r.path.startswith("/v1/batches/")]
    assert len(polls) == 4  # three in_progress, then completed
    assert outcome.results["a"].ok and outcome.batches[0]["status"] == "completed"


async def test_a_failed_batch_leaves_every_line_unanswered(api: FakeAPI) -> None:
    api.set(batch_fail="the fake was told to fail this batch")
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a"), chat_line("b")], request_id="r")
    batch = outcome.batches[0]
    assert batch["status"] == "failed"
    assert batch["errors"]["data"][0]["message"] == "the fake was told to fail this batch"
    assert outcome.results == {} and outcome.unanswered == ("a", "b")


async def test_an_expired_batch_returns_its_answers_and_the_rest_unanswered(
    api: FakeAPI,
) -> None:
    api.set(batch_expire_after=2)
    lines = [chat_line(f"l{i}") for i in range(5)]
    async with deferred(api) as sender:
        outcome = await sender.send(lines, request_id="r")
    assert outcome.batches[0]["status"] == "expired"
    assert sorted(outcome.results) == ["l0", "l1"]
    assert all(r.ok for r in outcome.results.values())
    assert outcome.unanswered == ("l2", "l3", "l4")
    assert not set(outcome.unanswered) & set(outcome.results)


async def test_a_failed_line_is_answered_with_its_refusal_and_not_sent_again(
    api: FakeAPI,
) -> None:
    api.set(batch_line_error="^bad")
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("good"), chat_line("bad-1")], request_id="r")
    assert outcome.results["good"].ok
    refused = outcome.results["bad-1"]
    assert refused.status_code == 400 and not refused.ok
    assert refused.body["error"]["type"] == "invalid_request_error"
    assert outcome.unanswered == ()
    assert outcome.batches[0]["request_counts"] == {"total": 2, "completed": 1, "failed": 1}


async def test_a_cancelled_batch_is_read_back_and_its_lines_are_unanswered(
    api: FakeAPI,
) -> None:
    api.set(batch_polls=1000)
    lines = [chat_line("a"), chat_line("b")]
    async with deferred(api) as sender:
        batch_id = await batch_of(sender).submit(
            CHAT_URL, [(x.custom_id, x.body) for x in lines], request_id="r"
        )
        assert (await sender.cancel(batch_id, lines, request_id="r"))["status"] == "cancelling"
        outcome = await sender.resume(batch_id, lines, request_id="r")
    assert outcome.batches[0]["status"] == "cancelled"
    assert outcome.results == {} and outcome.unanswered == ("a", "b")


async def test_a_batch_made_before_a_restart_is_resumed_not_sent_again(api: FakeAPI) -> None:
    api.set(batch_polls=2)
    lines = [chat_line("a"), chat_line("b")]
    async with deferred(api) as sender:
        batch_id = await batch_of(sender).submit(
            CHAT_URL, [(x.custom_id, x.body) for x in lines], request_id="r"
        )
    async with deferred(api) as again:  # a new client, as after a restart
        outcome = await again.resume(batch_id, lines, request_id="r2")
    assert api.batches_made == 1 and len(api.batch_lines) == 2
    assert sorted(outcome.results) == ["a", "b"] and outcome.unanswered == ()


# -- bounds and a hostile upstream ---------------------------------------------------------------


async def test_an_output_file_past_max_output_bytes_is_refused_with_the_key_named(
    api: FakeAPI,
) -> None:
    lines = [chat_line(f"l{i}") for i in range(20)]  # about 400 bytes of output a line
    async with deferred(api, max_output_bytes=2048) as sender:
        with pytest.raises(UpstreamError) as caught:
            await sender.send(lines, request_id="r")
    assert caught.value.status == 502
    assert "more than 2048 bytes ([batch] max_output_bytes)" in caught.value.message


async def test_a_hostile_output_can_neither_add_a_line_nor_answer_one_twice(
    api: FakeAPI,
) -> None:
    stranger = {"custom_id": "never-sent", "response": {"status_code": 200, "body": {}}}
    second = {
        "custom_id": "a",
        "response": {"status_code": 200, "body": {"object": "chat.completion", "forged": True}},
    }
    broken = {"custom_id": "b", "response": {"status_code": "200", "body": []}}
    api.set(
        batch_expire_after=1,  # "b" is not answered; the hostile lines must not answer it
        batch_output_extra=[json.dumps(stranger), json.dumps(second), "not json", "[1, 2]"]
        + [json.dumps(broken), json.dumps({"custom_id": "long", "pad": "a" * 300_000})],
    )
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a"), chat_line("b")], request_id="r")
    assert outcome.ignored == 6
    assert sorted(outcome.results) == ["a"] and "forged" not in outcome.results["a"].body
    assert outcome.results["a"].body["object"] == "chat.completion"
    assert outcome.unanswered == ("b",)


async def test_an_output_line_past_max_answer_bytes_is_dropped_and_the_rest_are_read(
    api: FakeAPI,
) -> None:
    long_line = json.dumps({"custom_id": "b", "pad": "a" * 200_000})  # ours, but too long
    tail = json.dumps({"custom_id": "c", "pad": "a" * 200_000})  # the file's last line
    api.set(batch_expire_after=1, batch_output_extra=[long_line, "not json", tail])
    lines = [chat_line("a"), chat_line("b"), chat_line("c")]
    async with deferred(api, max_answer_bytes=100_000) as sender:
        outcome = await sender.send(lines, request_id="r")
    assert sorted(outcome.results) == ["a"] and outcome.results["a"].ok
    assert outcome.ignored == 3  # the two long lines and the line that is not JSON
    assert outcome.unanswered == ("b", "c")


def _serve_fake(ports: Any, extra_lines: int, line_bytes: int) -> None:
    """A FakeAPI in a process of its own (so that its memory is not the test's), whose batch
    output files end with ``extra_lines`` lines of ``line_bytes`` for a custom_id never sent."""
    pad = "a" * (line_bytes - 40)
    line = json.dumps({"custom_id": "never-sent", "pad": pad})
    with FakeAPI(batch_output_extra=[line] * extra_lines) as fake:
        ports.put(fake.port)
        while True:
            time.sleep(1)


async def test_a_large_hostile_output_file_is_read_without_holding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """128 MiB of output lines the proxy never sent: read line by line and let go, the
    client's memory grows by far less than the file."""
    from tests.faults_support import MB, RssWatch

    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    lines, size = 128 * 1024, 1024
    child = spawn.Process(target=_serve_fake, args=(ports, lines, size), daemon=True)
    child.start()
    try:
        port = ports.get(timeout=60)
        remote = FakeAPI(port=port)  # only its url: the server runs in the child
        started = time.monotonic()
        with RssWatch([os.getpid()], every_s=0.005) as watch:
            async with deferred(remote) as sender:
                outcome = await sender.send([chat_line("a")], request_id="r")
        growth = watch.growth(os.getpid())
        print(
            f"read {lines * size // MB} MiB of output in {time.monotonic() - started:.2f} s; "
            f"the client's RSS grew by {growth / MB:.1f} MiB"
        )
    finally:
        child.kill()
        child.join()
    assert outcome.ignored == lines and outcome.results["a"].ok
    assert growth < 32 * MB


async def test_an_answer_that_echoes_the_proxys_key_is_cleared_of_it(api: FakeAPI) -> None:
    api.set(reply=f"the key you sent is {KEY}")
    async with deferred(api) as sender:
        outcome = await sender.send([chat_line("a")], request_id="r")
    said = outcome.results["a"].body["choices"][0]["message"]["content"]
    assert KEY not in json.dumps(outcome.results["a"].body)
    assert said == f"the key you sent is {MARK}"


async def test_a_batch_that_never_ends_is_not_waited_on_past_the_limit(api: FakeAPI) -> None:
    api.set(batch_polls=10_000)
    async with deferred(api) as sender:
        batch_id = await batch_of(sender).submit(
            CHAT_URL, [("a", chat_line("a").body)], request_id="r"
        )
        with pytest.raises(UpstreamError) as caught:
            await batch_of(sender).wait(batch_id, request_id="r", limit_s=0.2)
    assert caught.value.status == 504 and batch_id in caught.value.message


async def test_polls_that_fail_for_a_while_are_tried_again(api: FakeAPI) -> None:
    api.set(batch_polls=1)
    async with deferred(api) as sender:
        batch_id = await batch_of(sender).submit(
            CHAT_URL, [("a", chat_line("a").body)], request_id="r"
        )
        api.set(fail_status=500, fail_times=3)  # not retried by the policy: three failed polls
        outcome = await sender.resume(batch_id, [chat_line("a")], request_id="r")
    assert outcome.results["a"].ok


# -- the official SDK drives the fake ------------------------------------------------------------


def test_the_official_sdk_drives_the_fake_files_and_batches(api: FakeAPI) -> None:
    client = openai.OpenAI(base_url=api.url, api_key="sk-unused", max_retries=0)
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": CHAT_URL, "body": chat_line("x").body}
        for i in range(3)
    ]
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(content)
    assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h"
    )
    assert batch.status == "validating"
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 3 and batch.output_file_id
    output = client.files.content(batch.output_file_id).text.splitlines()
    assert [json.loads(x)["custom_id"] for x in output] == ["r0", "r1", "r2"]
    assert json.loads(output[0])["response"]["body"]["usage"]["completion_tokens"] == len(
        words(DEFAULT_REPLY)
    )
    assert [b.id for b in client.batches.list()] == [batch.id]
    api.set(batch_polls=5)
    second = client.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h"
    )
    assert client.batches.cancel(second.id).status == "cancelling"
    assert client.batches.retrieve(second.id).status == "cancelled"
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_a_bad_input_file_fails_the_batch_with_one_error_per_bad_line(api: FakeAPI) -> None:
    client = openai.OpenAI(base_url=api.url, api_key="sk-unused", max_retries=0)
    good = {"custom_id": "a", "method": "POST", "url": CHAT_URL, "body": chat_line("a").body}
    text = "\n".join(
        [
            json.dumps(good),
            "{not json",
            json.dumps(good),
            json.dumps({**good, "custom_id": "c", "url": "/v1/embeddings"}),
        ]
    )
    uploaded = client.files.create(file=("in.jsonl", text.encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT_URL, completion_window="24h"
    )
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "failed" and batch.errors is not None
    codes = [(e.line, e.code) for e in batch.errors.data or []]
    assert codes == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "mismatched_endpoint"),
    ]


# -- flex and sync: one call per line ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["flex", "sync"])
async def test_flex_and_sync_make_one_call_per_line(api: FakeAPI, mode: str) -> None:
    embedding = DeferredLine(
        custom_id="e", url="/v1/embeddings", body={"model": "text-embedding-3-small", "input": "x"}
    )
    lines = [chat_line("a"), chat_line("b"), embedding]
    async with deferred(api, fallback=mode) as sender:
        outcome = await sender.send(lines, request_id="r")
    assert api.batches_made == 0 and api.single_calls == 3
    assert sorted(outcome.results) == ["a", "b", "e"] and outcome.unanswered == ()
    chats = [r.body for r in api.requests if r.path == CHAT_URL]
    tiers = [body.get("service_tier") for body in chats]
    assert tiers == (["flex", "flex"] if mode == "flex" else [None, None])
    (embedded,) = [r.body for r in api.requests if r.path == "/v1/embeddings"]
    assert "service_tier" not in embedded
    assert outcome.results["a"].usage == expected_usage(chat_line("a"))


async def test_sync_lines_refused_or_rate_limited(api: FakeAPI) -> None:
    api.set(fail_status=400, fail_times=1)
    async with deferred(api, fallback="sync", sync_concurrency=1) as sender:
        outcome = await sender.send([chat_line("a"), chat_line("b")], request_id="r")
    assert outcome.results["a"].status_code == 400 and outcome.results["b"].ok
    api.reset()
    api.set(fail_status=429, retry_after=0)
    async with deferred(api, fallback="sync", sync_concurrency=1) as sender:
        outcome = await sender.send([chat_line("c")], request_id="r")
    assert outcome.results == {} and outcome.unanswered == ("c",)


async def test_lines_with_one_custom_id_twice_are_refused_before_any_call(api: FakeAPI) -> None:
    async with deferred(api) as sender:
        with pytest.raises(ValueError, match="custom_id"):
            await sender.send([chat_line("a"), chat_line("a")], request_id="r")
    assert api.count == 0


# -- litellm's providers -------------------------------------------------------------------------

LITELLM = {"gpt-4o-mini": "hosted_vllm/served-model"}


async def test_a_model_litellm_sends_goes_one_call_a_line_through_the_litellm_route(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", api.url)
    lines = [chat_line("a"), chat_line("b")]
    async with deferred(api, models=LITELLM) as sender:
        assert sender.api("gpt-4o-mini") is None and sender.api("gpt-4o") is not None
        outcome = await sender.send(lines, request_id="r")
    assert api.batches_made == 0 and api.single_calls == 2
    assert [r.body["model"] for r in api.requests] == ["served-model"] * 2
    assert sorted(outcome.results) == ["a", "b"] and outcome.unanswered == ()
    assert outcome.results["a"].usage is not None
