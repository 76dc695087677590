"""``/v1/files`` against the in-process app, with the official ``openai`` SDK: upload, read,
list, content and delete; each key its own files; the per-key quota checked before a byte is
stored; the browser rule for a form on a keyless proxy; a hostile form refused with a 400 or
413 naming its field."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.ledger.batches.files import FileStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from tests.conftest import settings_for
from tests.fake_api import FakeAPI

KEYS_ENV = "FRUGAL_TEST_FILES_KEYS"
ALICE, BOB, CAROL = "sk-alice-admin-0001", "sk-bob-client-0002", "sk-carol-client-0003"
LINES = b"".join(
    json.dumps(
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Hi {i}"}]},
        }
    ).encode()
    + b"\n"
    for i in range(3)
)


class App:
    def __init__(self, http: httpx.AsyncClient, ledger: Path) -> None:
        self.http = http
        self.ledger = ledger

    def sdk(self, key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=key or "sk-unused",
            base_url="http://localhost/v1",
            http_client=self.http,
            max_retries=0,
        )

    def used(self, owner: str | None) -> int:
        """The bytes ``owner`` keeps in files, read from the ledger file itself."""
        pool = Pool(parse(str(self.ledger)), size=1, timeout_s=3.0)
        try:
            return FileStore(pool, quota_bytes=1).used(owner)
        finally:
            pool.close()


@pytest.fixture
def app(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """``async with app(keys=False, **sections) as served``; with ``keys=True`` the app wants one
    of ALICE (admin), BOB, CAROL."""
    monkeypatch.setenv(KEYS_ENV, f"alice;admin:{ALICE},bob:{BOB},carol:{CAROL}")

    @asynccontextmanager
    async def factory(*, keys: bool = False, **sections: dict[str, Any]) -> AsyncIterator[App]:
        if keys:
            sections.setdefault("server", {})["api_keys_env"] = KEYS_ENV
        settings = settings_for(tmp_path, fake_api, **sections)
        async with make_client(settings) as http:
            yield App(http, tmp_path / "ledger.db")

    return factory


def form(boundary: str, parts: list[tuple[str, str | None, bytes]]) -> bytes:
    """A multipart/form-data body of ``(name, filename, content)`` parts, as written by hand."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else ""
        )
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


async def post_form(
    http: httpx.AsyncClient,
    parts: list[tuple[str, str | None, bytes]],
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = form("frugal-test-boundary", parts)
    return await http.post(
        "http://localhost/v1/files",
        content=body,
        headers={
            "content-type": "multipart/form-data; boundary=frugal-test-boundary",
            **(headers or {}),
        },
    )


async def test_a_file_is_uploaded_read_listed_and_deleted_through_the_sdk(app: Any) -> None:
    async with app() as served:
        client = served.sdk()
        made = await client.files.create(file=("in.jsonl", LINES), purpose="batch")
        assert made.object == "file" and made.purpose == "batch"
        assert made.bytes == len(LINES) and made.filename == "in.jsonl"
        again = await client.files.retrieve(made.id)
        assert again.id == made.id and again.bytes == len(LINES)
        content = await client.files.content(made.id)
        assert content.read() == LINES
        other = await client.files.create(file=("notes.txt", b"notes"), purpose="user_data")
        listed = await client.files.list(purpose="batch")
        assert [f.id for f in listed.data] == [made.id]
        both = (await client.files.list()).data
        assert {f.id for f in both} == {made.id, other.id}
        first = await client.files.list(limit=1, order="asc")
        assert len(first.data) == 1 and first.has_more
        rest = await client.files.list(limit=1, order="asc", after=first.data[0].id)
        assert len(rest.data) == 1 and not rest.has_more
        assert {first.data[0].id, rest.data[0].id} == {made.id, other.id}
        assert served.used(None) == len(LINES) + 5
        gone = await client.files.delete(made.id)
        assert gone.deleted and gone.id == made.id
        with pytest.raises(openai.NotFoundError) as missing:
            await client.files.retrieve(made.id)
        assert missing.value.body["param"] == "file_id"  # type: ignore[index]
        assert served.used(None) == 5


async def test_expires_after_is_kept(app: Any) -> None:
    async with app() as served:
        made = await served.sdk().files.create(
            file=("in.jsonl", LINES),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
        assert made.expires_at == made.created_at + 3600
        with pytest.raises(openai.BadRequestError) as bad:
            await served.sdk().files.create(
                file=("in.jsonl", LINES),
                purpose="batch",
                expires_after={"anchor": "created_at", "seconds": 10},
            )
        assert bad.value.body["param"] == "expires_after.seconds"  # type: ignore[index]


async def test_another_keys_file_is_a_404_and_an_admin_sees_every_file(app: Any) -> None:
    async with app(keys=True) as served:
        bob, carol, alice = served.sdk(BOB), served.sdk(CAROL), served.sdk(ALICE)
        made = await bob.files.create(file=("in.jsonl", LINES), purpose="batch")
        for call in (carol.files.retrieve, carol.files.content, carol.files.delete):
            with pytest.raises(openai.NotFoundError) as hidden:
                await call(made.id)
            assert hidden.value.body["param"] == "file_id"  # type: ignore[index]
        assert (await carol.files.list()).data == []
        with pytest.raises(openai.BadRequestError) as after:
            await carol.files.list(after=made.id)
        assert after.value.body["param"] == "after"  # type: ignore[index]
        assert [f.id for f in (await bob.files.list()).data] == [made.id]
        assert (await alice.files.retrieve(made.id)).id == made.id
        assert [f.id for f in (await alice.files.list()).data] == [made.id]
        assert (await bob.files.retrieve(made.id)).id == made.id  # carol's delete did nothing


async def test_an_upload_past_the_quota_is_refused_before_it_is_stored(app: Any) -> None:
    async with app(keys=True, batch={"file_quota_bytes": 4096}) as served:
        bob = served.sdk(BOB)
        await bob.files.create(file=("a.jsonl", b"x" * 3000), purpose="user_data")
        (kept,) = (await bob.files.list()).data
        for size in (2000, 200_000):  # past the room; past the room and its form slack
            with pytest.raises(openai.BadRequestError) as full:
                await bob.files.create(file=("b.jsonl", b"y" * size), purpose="user_data")
            assert full.value.body["param"] == "file"  # type: ignore[index]
            assert full.value.body["code"] == "file_quota_exceeded"  # type: ignore[index]
        assert [f.id for f in (await bob.files.list()).data] == [kept.id]
        carol = served.sdk(CAROL)  # another key's quota is its own
        assert await carol.files.create(file=("c.jsonl", b"z" * 3000), purpose="user_data")


async def test_a_keyless_proxy_refuses_an_upload_from_a_web_page(app: Any) -> None:
    async with app() as served:
        parts = [("purpose", None, b"batch"), ("file", "in.jsonl", LINES)]
        for headers in (
            {"origin": "https://evil.example"},
            {"origin": "null"},
            {"sec-fetch-site": "cross-site"},
        ):
            refused = await post_form(served.http, parts, headers)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "permission_denied"
        assert served.used(None) == 0
        plain = await served.http.post(
            "http://localhost/v1/files",
            content=b"purpose=batch",
            headers={"content-type": "text/plain"},
        )
        assert plain.status_code == 415
        foreign = await post_form(served.http, parts, {"host": "evil.example"})
        assert foreign.status_code == 421
        cancel = await served.http.post(
            "http://localhost/v1/batches/batch_x/cancel", headers={"origin": "https://evil.example"}
        )
        assert cancel.status_code == 403
        accepted = await post_form(served.http, parts, {"sec-fetch-site": "none"})
        assert accepted.status_code == 200, accepted.text
        assert served.used(None) == len(LINES)


async def test_a_keyed_proxy_takes_an_upload_with_an_origin(app: Any) -> None:
    async with app(keys=True) as served:
        parts = [("purpose", None, b"batch"), ("file", "in.jsonl", LINES)]
        made = await post_form(
            served.http,
            parts,
            {"origin": "https://app.example", "authorization": f"Bearer {BOB}"},
        )
        assert made.status_code == 200, made.text


@pytest.mark.parametrize(
    ("parts", "param"),
    [
        ([("purpose", None, b"batch"), ("file", None, LINES)], "file"),  # no filename
        (
            [("purpose", None, b"batch"), ("purpose", None, b"batch"), ("file", "a", LINES)],
            "purpose",
        ),
        ([("purpose", None, b"batch"), ("file", "a", LINES), ("file", "b", LINES)], "file"),
        ([("purpose", None, b"batch_output"), ("file", "a", LINES)], "purpose"),
        ([("file", "a", LINES)], "purpose"),
        ([("purpose", None, b"batch")], "file"),
        ([("purpose", None, b"batch"), ("file", "a", LINES), ("colour", None, b"red")], "colour"),
        (
            [
                ("purpose", None, b"batch"),
                ("file", "a", LINES),
                ("expires_after[seconds]", None, b"x"),
            ],
            "expires_after[anchor]",
        ),
    ],
)
async def test_a_bad_form_is_a_400_naming_its_field(
    app: Any, parts: list[tuple[str, str | None, bytes]], param: str
) -> None:
    async with app() as served:
        refused = await post_form(served.http, parts)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param
        assert served.used(None) == 0


async def test_a_form_past_max_body_bytes_is_a_413_naming_file(app: Any) -> None:
    async with app(server={"max_body_bytes": 64 * 1024}) as served:
        parts = [("purpose", None, b"batch"), ("file", "big.jsonl", b"x" * 200_000)]
        refused = await post_form(served.http, parts)
        assert refused.status_code == 413
        assert refused.json()["error"]["param"] == "file"
        assert served.used(None) == 0


async def test_bad_list_parameters_are_400s_naming_them(app: Any) -> None:
    async with app() as served:
        for query, param in (
            ("limit=0", "limit"),
            ("limit=x", "limit"),
            ("order=up", "order"),
            ("after=file-nothere", "after"),
            ("purpose=null", "purpose"),
            ("purpose=batch&purpose=batch", "purpose"),
            ("limit=1&limit=2", "limit"),
        ):
            answer = await served.http.get(f"http://localhost/v1/files?{query}")
            assert answer.status_code == 400, (query, answer.text)
            assert answer.json()["error"]["param"] == param


async def test_the_apps_upkeep_sweeps_expired_files_and_ends_expired_batches(app: Any) -> None:
    """The lifespan's upkeep (every minute; one pass run here): a file whose ``expires_at`` has
    passed is deleted and its bytes leave the quota; a batch past its window ends ``expired``."""
    async with app() as served:
        client = served.sdk()
        kept = await client.files.create(file=("kept.jsonl", LINES), purpose="batch")
        short = await client.files.create(
            file=("short.jsonl", LINES),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
        batch = await client.batches.create(
            input_file_id=kept.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with sqlite3.connect(served.ledger) as conn:  # an hour and a day later, as it were
            conn.execute("UPDATE batch_files SET expires_at = 1 WHERE id = ?", (short.id,))
            conn.execute("UPDATE batches SET expires_at = 1 WHERE id = ?", (batch.id,))
        state = served.http.app.state.services.batches
        assert await state.upkeep_once() == (1, 1)
        assert [f.id for f in (await client.files.list(purpose="batch")).data] == [kept.id]
        ended = await client.batches.retrieve(batch.id)
        assert ended.status == "expired" and ended.error_file_id is not None
        errors = (await client.files.content(ended.error_file_id)).read()
        assert [json.loads(line)["custom_id"] for line in errors.splitlines()] == [
            "line-0",
            "line-1",
            "line-2",
        ]
        assert served.used(None) == len(LINES) + len(errors)  # the error file counts
