"""Counterfactual token counts: a local answer counted again with the requested model's tokenizer.

The count goes through ``litellm.token_counter`` (for OpenAI models with tiktoken's own encoding of
that model: litellm's default is cl100k for every model, while gpt-4o and later use o200k).
Importing litellm takes seconds and counting costs CPU, so :class:`TokenCounter` does both on a
thread of its own, started with the ledger; the request path only hands it references.

The same counter estimates what an API call cost when the provider's usage never came (a stream
whose client left before its usage chunk): :meth:`TokenCounter.submit_estimate` counts the
upstream body's prompt side and the text that was generated.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from proxy import logs

# Prompt-side fields the provider bills beyond messages and tools: counted as their JSON text.
EXTRA_PROMPT_FIELDS = ("functions", "response_format")
# tiktoken encodings that litellm ships in its package (TIKTOKEN_CACHE_DIR): no download needed.
BUNDLED_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})


@dataclass(frozen=True, slots=True)
class CountJob:
    """A local answer to count with the requested model's tokenizer. It holds references only:
    the texts are read on the counter's thread, never copied on the request path."""

    model: str
    body: Mapping[str, Any]
    """The chat request: its ``messages`` and ``tools`` are the prompt."""
    completion: Mapping[str, Any]
    """The local ``chat.completion``: every choice's content and tool calls are the answer."""


def completion_texts(completion: Mapping[str, Any]) -> list[str]:
    texts: list[str] = []
    for choice in completion.get("choices") or []:
        message = choice.get("message") or {}
        if isinstance(message.get("content"), str) and message["content"]:
            texts.append(message["content"])
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            texts.append(str(function.get("name") or "") + str(function.get("arguments") or ""))
    return texts


class TokenCounter:
    """Counts tokens with ``litellm.token_counter`` on one daemon thread of its own.

    :meth:`start` imports litellm on that thread; :meth:`submit` queues a :class:`CountJob` and
    returns a :class:`~concurrent.futures.Future` of ``(prompt_tokens, completion_tokens)``. The
    thread is a daemon, so a tokenizer stuck on a download never holds up the process's exit.
    """

    def __init__(self, loader: Callable[[], Any] | None = None) -> None:
        self._loader = loader or _import_litellm
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._litellm: Any = None
        self._encodings: dict[str, Any] = {}
        self.ready: Future[None] = Future()
        self.failures = 0

    def start(self) -> Future[None]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="frugal-tokens", daemon=True)
            self._thread.start()
            self._call(self._load, self.ready)
        return self.ready

    def submit(self, job: CountJob) -> Future[tuple[int, int]]:
        return self._offer(lambda: self.count(job))

    def submit_estimate(self, job: CountJob) -> Future[tuple[int, int]]:
        """Like :meth:`submit`, for :meth:`estimate`."""
        return self._offer(lambda: self.estimate(job))

    def _offer(self, work: Callable[[], tuple[int, int]]) -> Future[tuple[int, int]]:
        """``work`` on the counter's thread; its result (or error) in the future returned."""
        future: Future[tuple[int, int]] = Future()
        if self._thread is None:
            future.set_exception(RuntimeError("TokenCounter.start() was not called"))
            return future
        self._call(work, future)
        return future

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def count(self, job: CountJob) -> tuple[int, int]:
        """Count now, on the calling thread: (prompt tokens, completion tokens)."""
        litellm = self._load()
        tokenizer = self._tokenizer(job.model)
        messages = list(job.body.get("messages") or [])
        tools = job.body.get("tools") or None
        prompt = int(
            litellm.token_counter(
                model=job.model, messages=messages, tools=tools, custom_tokenizer=tokenizer
            )
        )
        completion = 0
        for text in completion_texts(job.completion):
            completion += int(
                litellm.token_counter(
                    model=job.model,
                    text=text,
                    count_response_tokens=True,
                    custom_tokenizer=tokenizer,
                )
            )
        return prompt, completion

    def estimate(self, job: CountJob) -> tuple[int, int]:
        """What an API call for ``job.body`` that generated ``job.completion`` is billed, as
        far as a tokenizer can tell: :meth:`count`, plus the JSON text of the prompt-side fields
        it leaves out (``functions``, ``response_format``)."""
        prompt, completion = self.count(job)
        extra = {k: job.body[k] for k in EXTRA_PROMPT_FIELDS if job.body.get(k)}
        if extra:
            litellm = self._load()
            prompt += int(
                litellm.token_counter(
                    model=job.model,
                    text=json.dumps(extra, ensure_ascii=False),
                    count_response_tokens=True,
                    custom_tokenizer=self._tokenizer(job.model),
                )
            )
        return prompt, completion

    def _call(self, fn: Callable[[], Any], future: Future[Any]) -> None:
        self._jobs.put((fn, future))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                self.failures += 1
                future.set_exception(exc)

    def _load(self) -> Any:
        if self._litellm is None:
            litellm = self._loader()
            # The first count loads litellm's bundled tiktoken files (and points tiktoken there).
            litellm.token_counter(model="gpt-4o-mini", text="warm up", count_response_tokens=True)
            self._litellm = litellm
        return self._litellm

    def _tokenizer(self, model: str) -> dict[str, Any] | None:
        """tiktoken's encoding of an OpenAI model (None: litellm picks the tokenizer)."""
        name = model.removeprefix("openai/")
        if name not in self._encodings:
            encoding = None
            try:
                import tiktoken

                if tiktoken.encoding_name_for_model(name) in BUNDLED_ENCODINGS:
                    encoding = tiktoken.encoding_for_model(name)
            except (ImportError, KeyError, ValueError):
                encoding = None
            self._encodings[name] = (
                None if encoding is None else {"type": "openai_tokenizer", "tokenizer": encoding}
            )
        return self._encodings[name]  # type: ignore[no-any-return]


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True
    logs.adopt_library_loggers()  # its warnings as JSON fields, not its own plain text
    return litellm
