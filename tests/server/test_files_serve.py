"""The Files and Batch APIs on a real ``frugal serve`` process, driven by the official ``openai``
SDK: upload, read, list, content and delete a file; create, read, list and cancel a batch; a bad
input file gives a ``failed`` batch. (tests/server/test_files.py and test_batches.py hold the
rest against the in-process app; the hostile uploads are a row of tests/test_faults.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.fake_api import FakeAPI
from tests.server.test_files import LINES
from tests.server.test_serve import Served, api, serving  # noqa: F401 - the module's fake API

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def served(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:  # noqa: F811
    with serving(tmp_path_factory.mktemp("files"), api) as server:
        yield server


def test_files_and_batches_through_the_sdk_on_a_real_server(served: Served, api: FakeAPI) -> None:  # noqa: F811
    client: openai.OpenAI = served.client()
    made = client.files.create(file=("in.jsonl", LINES), purpose="batch")
    assert (made.object, made.purpose, made.bytes) == ("file", "batch", len(LINES))
    assert client.files.retrieve(made.id).filename == "in.jsonl"
    assert [f.id for f in client.files.list(purpose="batch").data] == [made.id]
    assert client.files.content(made.id).read() == LINES
    batch = client.batches.create(
        input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress"
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert client.batches.retrieve(batch.id).input_file_id == made.id
    assert [b.id for b in client.batches.list().data] == [batch.id]
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    bad = client.files.create(file=("bad.jsonl", b"[1, 2]\n"), purpose="batch")
    failed = client.batches.create(
        input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert failed.status == "failed" and failed.errors is not None
    assert [(e.line, e.code) for e in failed.errors.data] == [(1, "invalid_json_line")]
    assert client.files.delete(bad.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(bad.id)
    assert not [r for r in api.requests if "/files" in r[0] or "/batches" in r[0]]
    print(
        f"\nfiles and batches on frugal serve: batch {batch.id} "
        f"{json.dumps(batch.request_counts.to_dict())}"
    )
