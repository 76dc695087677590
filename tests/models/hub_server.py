"""A stand-in Hugging Face hub on loopback, for ``HF_ENDPOINT``: real HTTP, real GGUF files.

It answers the three requests ``huggingface_hub`` 2.4 makes for a pull, as the hub does:

    GET  /api/models/OWNER/NAME[/revision/REV]?blobs=true   the repository: its commit and
         every file (``siblings``: ``rfilename``, ``size``, ``lfs.sha256``, ``lfs.size``)
    HEAD /OWNER/NAME/resolve/REV/FILE   ``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag`` (the
         LFS SHA-256), ``X-Linked-Size``, ``Content-Length``, ``Accept-Ranges``
    GET  /OWNER/NAME/resolve/REV/FILE   the bytes, or from ``Range: bytes=N-`` on (206 with
         ``Content-Range``)

An unknown repository is 404 with ``X-Error-Code: RepoNotFound``, an unknown file 404 with
``EntryNotFound``, which is how the client tells them apart.

Fault knobs: ``cut_at[file] = n`` sends the full ``Content-Length`` and drops the connection after
``n`` bytes (once), and ``down_after_cut`` answers every later request 503 until ``down`` is
cleared, as a network outage would; ``flip_at[file] = i`` serves the file with byte ``i``
inverted (its listing keeps the true SHA-256). ``gated[repo] = token`` makes a repository gated
as the hub does it: its listing is public, and its files answer 401 with ``X-Error-Code:
GatedRepo`` to a request without ``Authorization: Bearer token``. A file may advertise a size of
its own (``size=``, say 40 GB) and is then never expected to be asked for.

Knobs of a hub that lies or misbehaves: ``overrun[file] = n`` answers the file's GET with no
``Content-Length`` and sends ``n`` bytes more than it listed, as long as the client reads;
``stall_at[file] = n`` stops after ``n`` bytes and then sends nothing, or one byte every
``drip_s`` seconds when that is set, until the client goes (at most ``STALL_LIMIT_S``);
``redirect[file] = base`` answers the file's HEAD and GET with a 302 to the same path on
``base``, and ``redirect_listing[repo] = base`` does the same for the repository's listing;
``redirect_other = base`` for every other path (the hub client's own requests).
File names in request paths are percent-decoded, so a name may hold any character.

What it saw: ``requests`` (method, path, Range header, Authorization header) and
``served[file]``, the body bytes written for each file.
"""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

COMMIT = "c0ffee" + "0" * 34
CHUNK = 1 << 16
STALL_LIMIT_S = 120.0
NO_REPO = b'{"error": "Repository not found"}'
_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$")


@dataclass
class Entry:
    path: Path  # the real bytes served
    size: int  # the size the hub advertises
    sha256: str


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class StandInHub:
    repos: dict[str, dict[str, Entry]] = field(default_factory=dict)
    cut_at: dict[str, int] = field(default_factory=dict)
    flip_at: dict[str, int] = field(default_factory=dict)
    gated: dict[str, str] = field(default_factory=dict)  # repo -> the token that may read it
    overrun: dict[str, int] = field(default_factory=dict)
    stall_at: dict[str, int] = field(default_factory=dict)
    drip_s: float | None = None
    redirect: dict[str, str] = field(default_factory=dict)
    redirect_listing: dict[str, str] = field(default_factory=dict)
    redirect_other: str | None = None
    down_after_cut: bool = False
    down: bool = False
    requests: list[Request] = field(default_factory=list)
    served: dict[str, int] = field(default_factory=dict)

    def add(self, repo: str, name: str, path: Path, *, size: int | None = None) -> Entry:
        data = path.read_bytes()
        entry = Entry(path, len(data) if size is None else size, hashlib.sha256(data).hexdigest())
        self.repos.setdefault(repo, {})[name] = entry
        return entry

    def reset(self) -> None:
        self.cut_at.clear()
        self.flip_at.clear()
        self.overrun.clear()
        self.stall_at.clear()
        self.drip_s = None
        self.redirect.clear()
        self.redirect_listing.clear()
        self.redirect_other = None
        self.down_after_cut = self.down = False
        self.requests.clear()
        self.served.clear()

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    # -- the server ---------------------------------------------------------------------------

    def __enter__(self) -> StandInHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

            def do_GET(self) -> None:
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append(
            Request(
                "HEAD" if head else "GET",
                path,
                h.headers.get("Range"),
                h.headers.get("Authorization"),
            )
        )
        if self.down:
            return _send(h, 503, b'{"error": "down"}', head=head)
        if m := _API.match(path):
            if base := self.redirect_listing.get(m.group(1)):
                return _redirect(h, base + h.path, head=head)
            return self._info(h, m.group(1), head=head)
        if m := _RESOLVE.match(path):
            return self._file(h, m.group(1), unquote(m.group(2)), head=head)
        if self.redirect_other:
            return _redirect(h, self.redirect_other + h.path, head=head)
        return _send(h, 404, b'{"error": "not found"}', head=head)

    def _info(self, h: BaseHTTPRequestHandler, repo: str, *, head: bool) -> None:
        files = self.repos.get(repo)
        if files is None:
            return _send(h, 404, NO_REPO, head=head, code="RepoNotFound")
        body = {
            "id": repo,
            "modelId": repo,
            "sha": COMMIT,
            "private": False,
            "siblings": [
                {
                    "rfilename": name,
                    "size": e.size,
                    "blobId": e.sha256[:40],
                    "lfs": {"size": e.size, "sha256": e.sha256, "pointerSize": 134},
                }
                for name, e in sorted(files.items())
            ],
        }
        _send(h, 200, json.dumps(body).encode(), head=head)

    def _file(self, h: BaseHTTPRequestHandler, repo: str, name: str, *, head: bool) -> None:
        files = self.repos.get(repo)
        if files is None:
            return _send(h, 404, NO_REPO, head=head, code="RepoNotFound")
        token = self.gated.get(repo)
        if token is not None and h.headers.get("Authorization") != f"Bearer {token}":
            return _send(h, 401, b'{"error": "gated"}', head=head, code="GatedRepo",
                         message=f"Access to model {repo} is restricted.")  # fmt: skip
        entry = files.get(name)
        if entry is None:
            return _send(h, 404, b'{"error": "Entry not found"}', head=head, code="EntryNotFound")
        if base := self.redirect.get(name):
            linked = {"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)}
            return _redirect(h, base + h.path, head=head, headers=linked)
        if not head and name in self.overrun:
            return self._overrun(h, entry, self.overrun[name], name)
        start = 0
        if not head and (r := h.headers.get("Range")):
            start = int(re.fullmatch(r"bytes=(\d+)-", r.strip()).group(1))  # type: ignore[union-attr]
        length = entry.size - start
        h.send_response(206 if start else 200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(length))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", f'"{entry.sha256}"')
        h.send_header("X-Linked-Etag", f'"{entry.sha256}"')
        h.send_header("X-Linked-Size", str(entry.size))
        h.send_header("X-Repo-Commit", COMMIT)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{entry.size - 1}/{entry.size}")
        h.end_headers()
        if head:
            return
        cut = self.cut_at.pop(name, None)
        if name in self.stall_at:
            return self._stall(h, entry, start, self.stall_at.pop(name), name)
        flip = self.flip_at.get(name)
        with entry.path.open("rb") as f:
            f.seek(start)
            pos = start
            while pos < entry.size:
                chunk = bytearray(f.read(CHUNK))
                if not chunk:
                    break
                if flip is not None and pos <= flip < pos + len(chunk):
                    chunk[flip - pos] ^= 0xFF
                if cut is not None and pos + len(chunk) > cut:
                    chunk = chunk[: cut - pos]
                h.wfile.write(chunk)
                self.served[name] = self.served.get(name, 0) + len(chunk)
                pos += len(chunk)
                if cut is not None and pos >= cut:
                    h.wfile.flush()
                    h.close_connection = True  # the rest never comes: the client sees a cut
                    self.down = self.down_after_cut
                    return

    def _overrun(self, h: BaseHTTPRequestHandler, entry: Entry, extra: int, name: str) -> None:
        """The listed bytes, then ``extra`` more, with no length given: the body ends when the
        connection does, so only the client's own count can stop it."""
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("ETag", f'"{entry.sha256}"')
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        body = entry.path.read_bytes()[: entry.size]
        try:
            for pos in range(0, len(body), CHUNK):
                self._write(h, body[pos : pos + CHUNK], name)
            left = extra
            while left > 0:
                self._write(h, b"\0" * min(CHUNK, left), name)
                left -= CHUNK
        except OSError:
            pass  # the client stopped reading

    def _stall(
        self, h: BaseHTTPRequestHandler, entry: Entry, start: int, at: int, name: str
    ) -> None:
        """Bytes up to ``at``, then silence, or a byte every ``drip_s``, until the client goes."""
        data = entry.path.read_bytes()
        try:
            self._write(h, data[start:at], name)
            h.wfile.flush()
            pos, until = at, time.monotonic() + STALL_LIMIT_S
            while time.monotonic() < until and pos < entry.size:
                ready, _, _ = select.select([h.connection], [], [], self.drip_s or 0.2)
                if ready and not h.connection.recv(1, socket.MSG_PEEK):
                    break  # the client has closed the connection
                if self.drip_s is not None:
                    self._write(h, data[pos : pos + 1], name)
                    h.wfile.flush()
                    pos += 1
        except OSError:
            pass  # the client gave up
        h.close_connection = True

    def _write(self, h: BaseHTTPRequestHandler, data: bytes, name: str) -> None:
        h.wfile.write(data)
        self.served[name] = self.served.get(name, 0) + len(data)


def _redirect(
    h: BaseHTTPRequestHandler, location: str, *, head: bool, headers: dict[str, str] | None = None
) -> None:
    h.send_response(302)
    h.send_header("Location", location)
    h.send_header("Content-Length", "0")
    h.send_header("X-Repo-Commit", COMMIT)
    for key, value in (headers or {}).items():
        h.send_header(key, value)
    h.end_headers()


def _send(
    h: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    *,
    head: bool,
    code: str | None = None,
    message: str | None = None,
) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.send_header("X-Repo-Commit", COMMIT)
    if code:
        h.send_header("X-Error-Code", code)
    if message:
        h.send_header("X-Error-Message", message)
    h.end_headers()
    if not head:
        h.wfile.write(body)
