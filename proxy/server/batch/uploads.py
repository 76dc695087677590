"""An upload's ``multipart/form-data`` body, read within bounds and split into its fields.

``POST /v1/files`` is the one endpoint whose body is not JSON: OpenAI's SDKs send the file as a
form (``file``, ``purpose``, ``expires_after[anchor]``, ``expires_after[seconds]``).
:func:`read_body` reads the body as it arrives and stops at ``bound`` bytes (the key's room
for files plus :data:`FORM_SLACK` for the other fields and the part headers), so a body that
cannot fit is refused before it is read to its end, let alone stored; ``[server]
max_body_bytes`` still holds below it (:mod:`proxy.server.limits`). :func:`parse_form` splits
the body by its boundary. Every field may come once: a field repeated, a field OpenAI does not
have (so a form holds at most four parts), a ``file`` part without a ``filename`` or a body
that is not a well-formed form is a 400 naming the field (``file`` for the form itself).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from proxy.errors import BadRequest

FORM_SLACK = 64 * 1024  # the bytes of a form beyond its file: part headers, small fields
MAX_FIELD_BYTES = 1024  # one field that is not the file
FIELDS = ("file", "purpose", "expires_after[anchor]", "expires_after[seconds]")
_PARAM = re.compile(rb';\s*([A-Za-z*]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))')


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content: bytes


def boundary_of(content_type: str | None) -> bytes:
    """The form's boundary, from its ``Content-Type``; a 400 naming ``file`` without one."""
    kind, _, rest = (content_type or "").partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise BadRequest("Send the file as multipart/form-data.", param="file")
    for match in _PARAM.finditer(b";" + rest.encode("latin-1")):
        if match.group(1).lower() == b"boundary":
            value = match.group(2) if match.group(2) is not None else match.group(3)
            if value and len(value) <= 70:
                return value
    raise BadRequest("The multipart/form-data body names no boundary.", param="file")


async def read_body(chunks: AsyncIterator[bytes], bound: int, refuse: BadRequest) -> bytes:
    """The body, read as it arrives; ``refuse`` is raised as soon as it passes ``bound``."""
    held = bytearray()
    async for chunk in chunks:
        held += chunk
        if len(held) > bound:
            raise refuse
    return bytes(held)


def parse_form(body: bytes, boundary: bytes) -> dict[str, Part]:
    """The form's fields by name, each once."""
    delimiter = b"--" + boundary
    start = body.find(delimiter)
    if start < 0:
        raise BadRequest("The form has no part.", param="file")
    parts: dict[str, Part] = {}
    at = start + len(delimiter)
    while True:
        if body.startswith(b"--", at):
            return parts
        if not body.startswith(b"\r\n", at):
            raise BadRequest("The form is not well formed.", param="file")
        head_end = body.find(b"\r\n\r\n", at + 2)
        if head_end < 0:
            raise BadRequest("A part of the form has no end to its headers.", param="file")
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise BadRequest("The form has no closing boundary.", param="file")
        part = _part(body[at + 2 : head_end], body[head_end + 4 : end])
        if part.name not in FIELDS:
            raise BadRequest(f"Unknown form field {part.name[:64]!r}.", param=part.name[:64])
        if part.name in parts:
            raise BadRequest(f"The form field {part.name!r} is given twice.", param=part.name)
        parts[part.name] = part
        at = end + 2 + len(delimiter)


def _part(head: bytes, content: bytes) -> Part:
    disposition = None
    for line in head.split(b"\r\n"):
        header, _, found = line.partition(b":")
        if header.strip().lower() == b"content-disposition":
            disposition = found
    if disposition is None or not disposition.strip().lower().startswith(b"form-data"):
        raise BadRequest("A part of the form has no Content-Disposition.", param="file")
    params: dict[bytes, bytes] = {}
    for match in _PARAM.finditer(disposition):
        value = match.group(2) if match.group(2) is not None else match.group(3)
        params[match.group(1).lower()] = value.replace(b'\\"', b'"')
    if b"name" not in params:
        raise BadRequest("A part of the form has no name.", param="file")
    name = params[b"name"].decode("utf-8", "replace")
    filename = params.get(b"filename")
    if name != "file" and len(content) > MAX_FIELD_BYTES:
        raise BadRequest(f"The form field {name[:64]!r} is too long.", param=name[:64])
    return Part(
        name=name,
        filename=None if filename is None else filename.decode("utf-8", "replace"),
        content=content,
    )
