"""Models that think before they answer: their thinking told apart from their answer.

A reasoning model (Qwen3, the DeepSeek-R1 distills and most small open models since) writes its
thinking between two tags, ``<think>`` and ``</think>``, then its answer. Its chat template says
so: it names both tags (to drop the thinking of earlier turns), its generation prompt often opens
the block itself (so the answer starts inside it, with no opening tag to see), and Qwen3's reads
``enable_thinking``, which, false, writes an empty block into the prompt: the model answers at
once. :func:`detect` reads that from the template and the tags' tokens (one special token each in
Qwen3's vocabulary; plain text pieces in a model given such a template).

What the engine then does with an answer (as llama-server's ``--reasoning-format``, Ollama's
``think`` and vLLM's ``--reasoning-parser`` do):

* the thinking goes out as ``reasoning_content`` and the answer alone as ``content``
  (:func:`split`, and :class:`Splitter` for a streamed answer, whose thinking pieces are
  :class:`ReasoningText`); the quality gate sees the answer only;
* the tokens up to and including ``</think>`` are counted as ``reasoning_tokens`` in ``usage``;
* an answer cut before its thinking ended (``max_tokens``, the deadline, or the thinking budget
  of the request's effort, :func:`budget_of`) has no answer at all: it is marked
  ``thinking_unfinished`` and is never accepted (the request goes to the API where it can);
* ``reasoning_effort`` ``none`` (or ``minimal``) turns thinking off where the template allows it
  (:func:`enable_thinking`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "OFF_EFFORTS",
    "ReasoningText",
    "Splitter",
    "ThinkFormat",
    "Watch",
    "budget_of",
    "detect",
    "enable_thinking",
    "opens_thinking",
    "split",
]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
OFF_EFFORTS = frozenset({"none", "minimal"})
"""Efforts that ask for no thinking: served with thinking turned off where the template can."""
DEFAULT_BUDGET = 1024
"""``[local] thinking_budget``'s default: the most tokens an answer at ``high`` effort thinks."""
EFFORT_SHARE = {"low": 0.25, "medium": 0.5, "high": 1.0, "xhigh": 1.0}
"""The share of ``[local] thinking_budget`` an effort may think for (no effort: medium)."""


class ReasoningText(str):
    """A streamed piece of thinking; a plain ``str`` is a piece of the answer.

    A subclass of ``str`` so that it travels through every ``on_token(str)`` callback (and the
    worker's pipe, pickled) unchanged, and the stream writers can tell the two apart."""

    __slots__ = ()


@dataclass(frozen=True)
class ThinkFormat:
    """How a model marks its thinking: the tags, whether its template honours
    ``enable_thinking``, and whether the tags are special tokens of its vocabulary."""

    open_tag: str = OPEN_TAG
    close_tag: str = CLOSE_TAG
    switch: bool = False
    special_tokens: bool = False

    def as_dict(self) -> dict[str, Any]:
        """What ``/healthz`` shows of it: its four fields, by name."""
        return asdict(self)


def detect(template: str, count_tokens: Callable[[str], int]) -> ThinkFormat | None:
    """The thinking format of a chat template, or None for a model that does not think.

    ``count_tokens(text)`` is how many tokens the model's vocabulary makes of ``text`` (parsing
    special tokens): a tag that is one token is a special token of a model trained to think."""
    if OPEN_TAG not in template or CLOSE_TAG not in template:
        return None
    special = count_tokens(OPEN_TAG) == 1 and count_tokens(CLOSE_TAG) == 1
    return ThinkFormat(switch="enable_thinking" in template, special_tokens=special)


def enable_thinking(request: dict[str, Any]) -> bool:
    """Whether the request lets the model think: not with an effort of ``none``/``minimal``,
    nor when a grammar constrains the answer from its first token (JSON mode, a schema, tools),
    which would leave no room for a thinking block."""
    if _effort(request) in OFF_EFFORTS:
        return False
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return False
    if request.get("tools") and request.get("tool_choice") != "none":
        return False
    return not (request.get("functions") and request.get("function_call") != "none")


def budget_of(request: dict[str, Any], budget: int) -> int:
    """The most tokens this request may think for: its effort's share of ``budget``."""
    effort = _effort(request)
    share = EFFORT_SHARE.get(effort or "medium", 1.0)
    return max(1, int(budget * share))


def _effort(request: dict[str, Any]) -> str | None:
    effort = request.get("reasoning_effort")
    if effort is None:
        reasoning = request.get("reasoning")
        if isinstance(reasoning, dict):
            effort = reasoning.get("effort")
    return effort if isinstance(effort, str) else None


def opens_thinking(prompt: str, fmt: ThinkFormat) -> bool:
    """Whether a rendered prompt leaves the thinking block open: the answer starts inside it."""
    tail = prompt.rstrip()
    return tail.endswith(fmt.open_tag)


def split(text: str, fmt: ThinkFormat, opened: bool) -> tuple[str | None, str, bool]:
    """An answer's ``(thinking, answer, finished)``.

    ``opened``: the prompt opened the block. Otherwise the answer thinks only if it starts with
    the opening tag. ``thinking`` is None for an answer that did not think; ``finished`` is
    False when the block never closed (then the whole text is thinking and the answer empty)."""
    body = text
    if not opened:
        stripped = text.lstrip()
        if not stripped.startswith(fmt.open_tag):
            return None, text, True
        body = stripped[len(fmt.open_tag) :]
    end = body.find(fmt.close_tag)
    if end < 0:
        return body.strip(), "", False
    return body[:end].strip(), body[end + len(fmt.close_tag) :].lstrip(), True


class Splitter:
    """Splits a streamed answer as it comes: thinking pieces go on as :class:`ReasoningText`,
    answer pieces as ``str``. Text that may still be the start of a tag is held back until the
    next piece says what it is; the whitespace around the tags is dropped, as :func:`split`
    does."""

    def __init__(self, fmt: ThinkFormat, opened: bool, on_text: Callable[[str], None]) -> None:
        self.fmt = fmt
        self.on_text = on_text
        self.state = "thinking" if opened else "start"
        self.pending = ""
        self.lead = True  # the next piece of the current part may start with whitespace to drop

    def feed(self, piece: str) -> None:
        self.pending += piece
        while self.pending:
            if self.state == "start":
                stripped = self.pending.lstrip()
                if stripped.startswith(self.fmt.open_tag):
                    self.pending = stripped[len(self.fmt.open_tag) :]
                    self.state, self.lead = "thinking", True
                    continue
                if stripped and not self.fmt.open_tag.startswith(stripped):
                    self.state = "answer"
                    self.lead = False  # an answer that did not think is passed on whole
                    continue
                return  # may still become the opening tag
            if self.state == "thinking":
                end = self.pending.find(self.fmt.close_tag)
                if end >= 0:
                    self._send(self.pending[:end].rstrip(), ReasoningText)
                    self.pending = self.pending[end + len(self.fmt.close_tag) :]
                    self.state, self.lead = "answer", True
                    continue
                # Hold back what may start the closing tag, and the whitespace before it.
                cut = len(self.pending) - _partial(self.pending, self.fmt.close_tag)
                cut = len(self.pending[:cut].rstrip())
                self._send(self.pending[:cut], ReasoningText)
                self.pending = self.pending[cut:]
                return
            self._send(self.pending, str)
            self.pending = ""

    def close(self) -> None:
        """The answer ended: pass on what was held back."""
        if self.state == "thinking":
            self._send(self.pending.rstrip(), ReasoningText)
        elif self.state == "answer":
            self._send(self.pending, str)
        elif self.pending:  # it never became the opening tag: the answer, whole
            self.on_text(self.pending)
        self.pending = ""

    def _send(self, text: str, kind: type[str]) -> None:
        if self.lead:
            text = text.lstrip()
            if text:
                self.lead = False
        if text:
            self.on_text(kind(text))


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class Watch:
    """One answer's thinking, watched token by token as it is generated.

    It counts the thinking tokens (up to and including the one that closes the block), says
    when the thinking passes its budget, passes streamed pieces through a :class:`Splitter`,
    and at the end (:meth:`apply`) rewrites the finished ``chat.completion``: ``content`` the
    answer alone, ``reasoning_content`` the thinking, the answer's logprobs only,
    ``usage.completion_tokens_details.reasoning_tokens``, and ``frugal["thinking"]``."""

    def __init__(
        self,
        fmt: ThinkFormat,
        opened: bool,
        budget: int,
        on_token: Callable[[str], None] | None,
    ) -> None:
        self.fmt = fmt
        self.opened = opened
        self.budget = budget
        self.tokens = 0
        self.state = "thinking" if opened else "start"
        self.start = 0  # where the thinking starts in the text
        self.seen = 0  # how far the text was searched for the closing tag
        self.splitter = Splitter(fmt, opened, on_token) if on_token is not None else None

    @property
    def on_token(self) -> Callable[[str], None] | None:
        return self.splitter.feed if self.splitter is not None else None

    def over_budget(self, text: str, n_tokens: int) -> bool:
        """After each generated token (``text`` the answer so far, ``n_tokens`` its tokens):
        whether the thinking has used up its budget without ending."""
        if self.state == "start":
            stripped = text.lstrip()
            if stripped.startswith(self.fmt.open_tag):
                self.state = "thinking"
                self.start = self.seen = len(text) - len(stripped) + len(self.fmt.open_tag)
            elif stripped and not self.fmt.open_tag.startswith(stripped):
                self.state = "answer"
        if self.state != "thinking":
            return False
        self.tokens = n_tokens
        back = max(self.start, self.seen - len(self.fmt.close_tag))
        if text.find(self.fmt.close_tag, back) >= 0:
            self.state = "answer"
            return False
        self.seen = len(text)
        return n_tokens >= self.budget

    def close(self) -> None:
        """The answer ended: the streamed text held back goes out."""
        if self.splitter is not None:
            self.splitter.close()

    def apply(self, completion: dict[str, Any]) -> None:
        """Rewrite a finished completion of one answer (see the class docstring)."""
        choice = completion["choices"][0]
        message = choice["message"]
        usage = completion["usage"]
        thinking, answer, finished = split(message.get("content") or "", self.fmt, self.opened)
        if thinking is None:
            usage["completion_tokens_details"] = {"reasoning_tokens": 0}
            return
        message["content"] = answer
        message["reasoning_content"] = thinking
        logprobs = choice.get("logprobs") or {}
        entries = list(logprobs.get("content") or [])[self.tokens :]
        while entries and not str(entries[0].get("token", "")).strip():
            entries.pop(0)  # the whitespace after the closing tag, dropped from the answer
        if logprobs:
            logprobs["content"] = entries if finished else []
        spent = self.tokens if finished else int(usage["completion_tokens"])
        usage["completion_tokens_details"] = {"reasoning_tokens": spent}
        completion["frugal"]["thinking"] = {
            "finished": finished,
            "reasoning_tokens": spent,
            "budget": self.budget,
        }
