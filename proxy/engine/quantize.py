"""``frugal quantize IN.gguf OUT.gguf [--type Q4_K_M]``: requantize a GGUF with llama.cpp.

Q4_K_M is the recommended format for a CPU box: about 4.8 bits a weight, close to Q8_0 in
quality at 60% of its size, and faster wherever decoding is bound by memory bandwidth (the
production account this project started from saw an 8B Q8_0 swap on a 7.8 GB VPS). Quantize
from F16/BF16/F32 when you can; requantizing an already quantized file works but loses a little
more quality.

Progress comes from llama.cpp's own log lines (one per tensor), counted while it works.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from proxy.engine.gguf import GGUFError, read_header
from proxy.errors import UserError

# Formats offered by `frugal quantize` and their llama_ftype values.
TYPES = {
    "Q4_K_M": 15,
    "Q4_K_S": 14,
    "Q5_K_M": 17,
    "Q5_K_S": 16,
    "Q6_K": 18,
    "Q8_0": 7,
    "Q4_0": 2,
    "Q3_K_M": 12,
    "IQ4_NL": 25,
    "F16": 1,
}
_FLOAT_TYPES = ("F32", "F16", "BF16")
_TENSOR_LINE = re.compile(rb"\[\s*(\d+)\s*/\s*(\d+)\s*\]")


class QuantizeError(UserError):
    """The quantization cannot be done; the message says why and what to do."""

    label = "frugal quantize"


@dataclass(frozen=True)
class QuantizeResult:
    output: str
    type: str
    source_type: str
    input_bytes: int
    output_bytes: int
    seconds: float
    requantized: bool


def quantize(
    source: str,
    target: str,
    *,
    type_name: str = "Q4_K_M",
    threads: int = 0,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> QuantizeResult:
    """Write ``target``, a ``type_name`` copy of the GGUF ``source``."""
    import llama_cpp

    kind = type_name.upper()
    if kind not in TYPES:
        raise QuantizeError(f"unknown type {type_name!r}: expected one of {', '.join(TYPES)}")
    if not os.path.isfile(source):
        raise QuantizeError(f"input file not found: {source}")
    try:
        header = read_header(source)
    except (GGUFError, OSError) as exc:
        raise QuantizeError(f"cannot read {source} as GGUF: {exc}") from exc
    if os.path.abspath(source) == os.path.abspath(target):
        raise QuantizeError("the output must be a different file from the input")
    if os.path.exists(target) and not force:
        raise QuantizeError(f"{target} already exists (use --force to overwrite it)")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise QuantizeError(f"cannot write into {folder}: no such folder, or not writable")
    requantized = header.file_type not in _FLOAT_TYPES
    if header.file_type == kind:
        raise QuantizeError(f"{source} is already {kind}")

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[kind]
    params.nthread = threads
    params.allow_requantize = requantized

    total = max(header.tensor_count, 1)

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def on_log(level: int, text: bytes, user_data: Any) -> None:
        found = _TENSOR_LINE.search(text or b"")
        if found and progress is not None:
            progress(int(found.group(1)), int(found.group(2)) or total)

    started = time.perf_counter()
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
    try:
        code = llama_cpp.llama_model_quantize(
            source.encode("utf-8"), target.encode("utf-8"), ctypes.byref(params)
        )
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    if code != 0:
        if os.path.exists(target):
            os.remove(target)
        raise QuantizeError(
            f"llama.cpp could not quantize {source} to {kind} (code {code}); some architectures "
            "or tensor shapes do not support every type: try Q8_0 or Q4_0"
        )
    return QuantizeResult(
        output=target,
        type=kind,
        source_type=header.file_type,
        input_bytes=header.file_size,
        output_bytes=os.path.getsize(target),
        seconds=time.perf_counter() - started,
        requantized=requantized,
    )


def run(source: str, target: str, type_name: str, force: bool, out: TextIO | None = None) -> int:
    """The CLI: progress and result on stderr/stdout, exit 0; a :class:`QuantizeError` (exit 1)
    is printed by the CLI's ``main``."""
    out = out or sys.stderr
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or done == total:
            last[0] = now
            print(f"\rquantizing: tensor {done}/{total}", end="", file=out, flush=True)

    result = quantize(source, target, type_name=type_name, force=force, progress=show)
    print("", file=out)
    if result.requantized:
        print(
            f"note: {source} was already quantized ({result.source_type}); quantizing from the "
            "F16 original keeps more quality",
            file=out,
        )
    print(
        f"wrote {result.output}: {result.type}, {result.output_bytes / 2**20:.1f} MiB "
        f"(from {result.source_type}, {result.input_bytes / 2**20:.1f} MiB) "
        f"in {result.seconds:.1f} s"
    )
    return 0
