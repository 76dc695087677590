"""Read a GGUF file's header (its metadata key-value pairs) without loading the model.

``frugal check``, the memory guard and the proxy's prompt-size pre-check need a few numbers from
the model (layers, KV heads, head size, context, vocabulary) before, or without, starting
llama.cpp. Scalars are kept; arrays are kept as their length, except that for string arrays the
longest element's byte length is kept too (for ``tokenizer.ggml.tokens``: the most bytes one
token can stand for).

A split model's ``file_size`` is that of all its parts (``-00001-of-0000N``), as llama.cpp loads
them all: the memory guard counts every part's weights.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GGUF"

_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_STRING = 8
_ARRAY = 9

# llama_ftype values (general.file_type) of the common formats.
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


class GGUFError(Exception):
    """The file is not a GGUF this reader understands."""


@dataclass(frozen=True)
class ArrayInfo:
    length: int
    max_item_bytes: int = 0  # string arrays only


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    tensor_count: int
    file_size: int
    metadata: dict[str, Any] = field(repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def file_type(self) -> str:
        value = self.metadata.get("general.file_type")
        if value is None:
            return "unknown"
        return FILE_TYPES.get(int(value), f"type {value}")

    @property
    def n_layer(self) -> int:
        return int(self.arch_value("block_count", 0))

    @property
    def n_embd(self) -> int:
        return int(self.arch_value("embedding_length", 0))

    @property
    def n_head(self) -> int:
        return _first(self.arch_value("attention.head_count", 0))

    def _arch_or(
        self, key: str, otherwise: Callable[[], int], read: Callable[[Any], int] = int
    ) -> int:
        """The architecture's ``key`` read as a number, or ``otherwise()`` when the file
        leaves it out (a default derived from other fields)."""
        value = self.arch_value(key)
        return read(value) if value is not None else otherwise()

    @property
    def n_head_kv(self) -> int:
        return self._arch_or("attention.head_count_kv", lambda: self.n_head, read=_first)

    @property
    def head_dim_k(self) -> int:
        return self._arch_or(
            "attention.key_length", lambda: self.n_embd // self.n_head if self.n_head else 0
        )

    @property
    def head_dim_v(self) -> int:
        return self._arch_or("attention.value_length", lambda: self.head_dim_k)

    @property
    def n_ctx_train(self) -> int:
        return int(self.arch_value("context_length", 0))

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return tokens.length if isinstance(tokens, ArrayInfo) else 0

    @property
    def max_token_bytes(self) -> int:
        """An upper bound of the bytes of text one token stands for (0 when unknown).

        Token strings are stored escaped (GPT-2's byte alphabet, SentencePiece's ``▁``), which
        only ever takes as many bytes as the text or more, so this is a safe upper bound.
        """
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return tokens.max_item_bytes if isinstance(tokens, ArrayInfo) else 0

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """K and V cache bytes for one token over all layers (f16 by default)."""
        per_layer = self.n_head_kv * (self.head_dim_k + self.head_dim_v) * bytes_per_value
        return self.n_layer * per_layer


def _first(value: Any) -> int:
    if isinstance(value, ArrayInfo):  # per-layer head counts: not kept, assume the first
        return 0
    return int(value or 0)


class _Reader:
    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise GGUFError("the file ends inside its header (truncated?)")

    def scalar(self, fmt: str, width: int) -> Any:
        self.need(width)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return value

    def string_length(self) -> int:
        n = int(self.scalar("<Q", 8))
        if n > self.size - self.pos:
            raise GGUFError(f"a string of {n} bytes runs past the end of the file")
        return n

    def string(self) -> str:
        n = self.string_length()
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(*_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item = int(self.scalar("<I", 4))
            count = int(self.scalar("<Q", 8))
            if item in _SCALARS:
                width = _SCALARS[item][1]
                self.need(width * count)
                self.pos += width * count
                return ArrayInfo(count)
            if item == _STRING:
                longest = 0
                for _ in range(count):
                    n = self.string_length()
                    self.pos += n
                    longest = max(longest, n)
                return ArrayInfo(count, longest)
            raise GGUFError(f"unsupported array item type {item}")
        raise GGUFError(f"unknown value type {kind}")


def read_header(path: str) -> GGUFHeader:
    """The metadata of the GGUF at ``path``; raises GGUFError or OSError."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 24:
            raise GGUFError(f"{path}: {size} bytes is too small for a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != MAGIC:
                raise GGUFError(f"{path}: not a GGUF file (it starts with {bytes(buf[:4])!r})")
            r = _Reader(buf)
            r.pos = 4
            version = int(r.scalar("<I", 4))
            if version not in (2, 3):
                raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            tensors = int(r.scalar("<Q", 8))
            count = int(r.scalar("<Q", 8))
            if count > 1_000_000:
                raise GGUFError(f"{path}: {count} metadata entries; the header is corrupt")
            metadata: dict[str, Any] = {}
            for _ in range(count):
                key = r.string()
                kind = int(r.scalar("<I", 4))
                metadata[key] = r.value(kind)
    return GGUFHeader(
        path=path,
        version=version,
        tensor_count=tensors,
        file_size=size + _other_parts_size(path, metadata),
        metadata=metadata,
    )


_FIRST_PART = re.compile(r"-00001-of-(\d{5})\.gguf$")


def _other_parts_size(path: str, metadata: dict[str, Any]) -> int:
    """The bytes of a split model's other parts (``…-00002-of-00003.gguf``, …), which llama.cpp
    loads with the first: the model's weights are all of them. 0 for a single file."""
    first = _FIRST_PART.search(path)
    count = int(metadata.get("split.count", 0) or 0)
    if first is None or count < 2:
        return 0
    total = 0
    for i in range(2, count + 1):
        part = path[: first.start()] + f"-{i:05d}-of-{first.group(1)}.gguf"
        try:
            total += os.path.getsize(part)
        except OSError:
            pass  # a missing part: llama.cpp says so when it loads
    return total
