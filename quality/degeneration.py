"""Degeneration: output that is broken whatever the question was.

- ``empty``: nothing but whitespace (and no tool call).
- ``truncated``: the engine stopped for reasons of its own (full context, deadline). A cut by
  the client's own ``max_tokens`` is not a hard fault: the API would cut it too.
- ``cut_off`` (feature ``cut_mid``): the client's ``max_tokens`` cut the answer mid-sentence. Soft:
  a short task that a small model turns into a ramble ends this way, while an API model would
  usually have finished inside the same budget; the combiner weighs it from data.
- ``template_leak``: chat-template or control tokens in the text, or a line that is nothing but
  a role name (``user``, ``model``…: what is left of a turn marker once the special tokens are
  detokenized away), the mark of a model that is not chat-tuned or a template that does not fit.
- ``prompt_echo``: the answer opens by repeating the user's message word for word, as a base
  model continuing a document does; a chat model (local or API) answers instead.
- ``repetition``: the answer loops (repeated word n-grams or lines).
- ``wrong_language``: the answer is in another language than the question (or than the one the
  instructions ask for).
"""

from __future__ import annotations

import math
import re

from quality import language
from quality._types import Signal
from quality._view import View

TEMPLATE_TOKENS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<|im_sep|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|assistant|>",
    "<|user|>",
    "<|system|>",
    "<|end|>",
    "<|eos|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "[INST]",
    "[/INST]",
    "<<SYS>>",
    "<</SYS>>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<|pad|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
)
_CLOSE_S = re.compile(r"</s>")
_OPEN_S = re.compile(r"<s>")
_SPECIAL_LIKE = re.compile(r"<\|[a-z_]{2,30}\|>")
_ROLE_ONLY = re.compile(r"^\W*(user|assistant|model|system|human)\W*$", re.I)
_GLUED_ROLE = re.compile(r"[^\x00-\x7f](user|model|assistant)$")
"""A role name glued to a stray non-ASCII piece at the end of a line: a detokenized turn marker."""
ECHO_WORDS = 12
ECHO_MIN_WORDS = 4

REPEAT_N = 3
REPEAT_MIN_WORDS = 10
REPEAT_FLAG = 0.3
REPEAT_HARD = 0.75
"""A ratio this high is a loop (the same phrase over and over), not a list of similar items."""

ENGINE_STOPS = frozenset({"context_full", "deadline", "cancelled"})

_WORD = re.compile(r"\w+", re.UNICODE)
_NAME = "degeneration"


def leaked_tokens(text: str) -> list[str]:
    found = [tok for tok in TEMPLATE_TOKENS if tok in text]
    found.extend(m for m in _SPECIAL_LIKE.findall(text) if m not in found)
    if _CLOSE_S.search(text) and not _OPEN_S.search(text):
        found.append("</s>")  # a lone </s>, not an HTML strikethrough
    for line in text.splitlines():
        m = _ROLE_ONLY.match(line) or _GLUED_ROLE.search(line)
        if m:
            found.append(f"role:{m.group(1).lower()}")
            break
    return found


def echoes_prompt(text: str, prompt: str) -> bool:
    """True when the answer opens with the prompt's first words, verbatim."""
    p = _WORD.findall(prompt.lower())
    if len(p) < ECHO_MIN_WORDS:
        return False
    k = min(ECHO_WORDS, len(p))
    return _WORD.findall(text.lower())[:k] == p[:k]


def repeat_ratio(text: str) -> float:
    """Share of repeated word n-grams or repeated lines, whichever is larger, in [0, 1)."""
    words = _WORD.findall(text.lower())
    ratio = 0.0
    if len(words) >= REPEAT_MIN_WORDS:
        grams = [tuple(words[i : i + REPEAT_N]) for i in range(len(words) - REPEAT_N + 1)]
        ratio = 1.0 - len(set(grams)) / len(grams)
    elif len(text) >= 24:
        # Few word boundaries (CJK, emoji, one long token run): use character 6-grams.
        compact = "".join(text.split())
        grams_c = [compact[i : i + 6] for i in range(len(compact) - 5)]
        if grams_c:
            ratio = 1.0 - len(set(grams_c)) / len(grams_c)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) >= 3:
        ratio = max(ratio, 1.0 - len(set(lines)) / len(lines))
    return ratio


def is_engine_truncation(view: View) -> bool:
    """True when the answer was cut by the engine, not by the client's own token limit."""
    if view.stop_cause is not None:
        if view.stop_cause in ENGINE_STOPS:
            return True
        if view.stop_cause == "max_tokens":
            # The client's limit if they set one and it was reached; otherwise an engine default.
            return view.max_tokens is None or (
                view.completion_tokens is not None and view.completion_tokens < view.max_tokens
            )
        return False
    if view.finish_reason != "length":
        return False
    if view.max_tokens is None:
        return True
    if view.completion_tokens is None:
        return False  # cannot tell: give the benefit of the doubt to the client's own limit
    return view.completion_tokens < view.max_tokens


_FINISHED = re.compile(r"[.!?。！？…)\]}\"'`”’*]\s*$")
"""An answer that ends here ended a sentence, a quote or a code block."""


def degeneration(view: View) -> Signal:
    text = view.content
    hard: list[str] = []
    soft: dict[str, str] = {}
    leaks = leaked_tokens(text)
    if leaks:
        hard.append("template_leak")
    stripped = text
    for tok in leaks:
        stripped = stripped.replace(tok, " ")
    if not stripped.strip() and not view.tool_calls:
        hard.insert(0, "empty")
    elif echoes_prompt(stripped, view.prompt):
        hard.append("prompt_echo")
    if is_engine_truncation(view):
        hard.append("truncated")

    rep = repeat_ratio(stripped)
    if rep >= REPEAT_HARD:
        hard.append("repetition")
    elif rep >= REPEAT_FLAG:
        soft["repetition"] = "rep_ratio"

    wrong = 0.0
    expected = language.expected_language(view.instructions, view.prompt)
    if expected is not None:
        got = language.detect(stripped)
        if got is not None and got != expected:
            wrong = 1.0
            soft["wrong_language"] = "wrong_language"

    cut = 0.0
    if view.finish_reason == "length" and not _FINISHED.search(stripped):
        cut = 1.0
        soft["cut_off"] = "cut_mid"

    words = len(_WORD.findall(stripped))
    features = {
        "cut_mid": cut,
        "rep_ratio": rep,
        "wrong_language": wrong,
        "len_log": math.log1p(words),
    }
    return Signal(_NAME, applied=True, features=features, hard=tuple(hard), soft=soft)
