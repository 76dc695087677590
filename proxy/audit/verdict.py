"""The cheap exact check that settles an audit without a judge.

:func:`exact_check` compares the local answer (the *candidate*) with the API's answer (the
*reference*) and says either that the candidate is correct, naming the rule that matched, or
nothing: ``None`` means "not decided", never "wrong", and the judge decides. So every rule here
only fires when it is sure. It follows the same notion of correctness as the judge:

``strict``  the right content *and* every explicit format instruction. The reference is taken
            to follow the request, so the candidate must have the same form: equal text (up to
            white space), both a bare number of the same value, both the same JSON in the same
            wrapping, both the same bare label (up to one final full stop).
``content`` the right content in any form: equal text up to case, punctuation and markdown;
            the same number (one side bare, the other naming that number and no other); the
            same JSON value wherever it sits; the reference's label named by a short answer
            that names no other of the request's options and negates nothing (a label is a
            few words without digits).

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from quality.schema import json_values

Match = Literal["text", "number", "json", "label"]

_SPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|\.\d)")
_BARE_NUMBER = re.compile(r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\.?")
_FENCE = re.compile(r"```[\w+-]*\n(.*?)\n?```", re.S)
_MARKDOWN = re.compile(r"[*_`~#>]+")
_PUNCT = re.compile(r"[^\w\s]+")
_NEGATION = frozenset("not no never neither nor isn't isnt aren't arent doesn't doesnt".split())
_MAX_LABEL_WORDS = 4
_MAX_LABEL_ANSWER_WORDS = 12
_MAX_JSON_CHARS = 200_000


def exact_check(
    reference: str,
    candidate: str,
    *,
    correctness: str,
    request: Sequence[dict[str, Any]] = (),
) -> Match | None:
    """The rule by which ``candidate`` is as correct as ``reference``, or None (not decided).
    ``request`` is the client's messages (the options of a label question are read there)."""
    if correctness == "strict":
        return _strict(reference, candidate)
    if correctness == "content":
        return _content(reference, candidate, request)
    raise ValueError(f"unknown correctness {correctness!r}")


def _strict(reference: str, candidate: str) -> Match | None:
    ref, cand = squash(reference), squash(candidate)
    if not ref:
        return None
    if ref == cand:
        return "text"
    ref_n, cand_n = bare_number(ref), bare_number(cand)
    if ref_n is not None and ref_n == cand_n:
        return "number"
    ref_fenced, cand_fenced = (
        _FENCE.fullmatch(reference.strip()),
        _FENCE.fullmatch(candidate.strip()),
    )
    if (ref_fenced is None) == (cand_fenced is None):
        ref_body = ref_fenced.group(1) if ref_fenced else reference
        cand_body = cand_fenced.group(1) if cand_fenced else candidate
        ref_j, cand_j = _whole_json(ref_body), _whole_json(cand_body)
        if ref_j is not None and cand_j is not None and same_json(ref_j, cand_j):
            return "json"
    if _is_label(ref) and ref.removesuffix(".") == cand.removesuffix("."):
        return "label"
    return None


def _content(reference: str, candidate: str, request: Sequence[dict[str, Any]]) -> Match | None:
    ref, cand = plain(reference), plain(candidate)
    if not ref:
        return None
    if ref == cand:
        return "text"
    ref_n, cand_n = bare_number(squash(reference)), bare_number(squash(candidate))
    if ref_n is not None and numbers_in(candidate) == [ref_n] * len(numbers_in(candidate)) != []:
        return "number"
    if cand_n is not None and numbers_in(reference) == [cand_n] * len(numbers_in(reference)) != []:
        return "number"
    ref_j, cand_j = find_json(reference), find_json(candidate)
    if ref_j is not None and cand_j is not None and same_json(ref_j, cand_j):
        return "json"
    if ref_j is None and _is_label(ref) and _names_label(cand, ref, request_text(request)):
        return "label"
    return None


# -- normalising ------------------------------------------------------------------------------


def squash(text: str) -> str:
    """NFC, trimmed, every run of white space one space."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def plain(text: str) -> str:
    """Case, markdown and punctuation gone, numbers written one way ("-3", "1000", "2.5"):
    what a reader takes in."""
    text = unicodedata.normalize("NFKC", text).casefold()
    out, last = [], 0
    for m in _NUMBER.finditer(text):
        value = _decimal(m.group(0))
        if value is None:  # pragma: no cover (the pattern only matches numbers)
            continue
        out += [_words(text[last : m.start()]), f" {value.normalize():f} "]
        last = m.end()
    out.append(_words(text[last:]))
    return squash("".join(out))


def _words(text: str) -> str:
    return _PUNCT.sub(" ", _MARKDOWN.sub(" ", text).replace("'", ""))


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("\u2212", "-"))
    except InvalidOperation:
        return None


def bare_number(text: str) -> Decimal | None:
    """The value of a text that is a number and nothing else (a final full stop allowed)."""
    text = text.strip()
    if not _BARE_NUMBER.fullmatch(text):
        return None
    return _decimal(text.removesuffix("."))


def numbers_in(text: str) -> list[Decimal]:
    """Every number written in ``text``, in order."""
    values = (_decimal(m.group(0)) for m in _NUMBER.finditer(text))
    return [v for v in values if v is not None]


# -- JSON -------------------------------------------------------------------------------------


def _whole_json(text: str) -> Any:
    """The object or array that ``text`` is, whole; None otherwise."""
    text = text.strip()
    if not text or text[0] not in "[{" or len(text) > _MAX_JSON_CHARS:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


def find_json(text: str) -> Any:
    """An object or array written anywhere in ``text``: the whole text, a fenced block, or the
    first bracketed span that parses. None when there is none."""
    whole = _whole_json(text)
    if whole is not None:
        return whole
    for fenced in _FENCE.finditer(text):
        value = _whole_json(fenced.group(1))
        if value is not None:
            return value
    return next(json_values(text, starts_within=_MAX_JSON_CHARS), None)


def same_json(a: Any, b: Any) -> bool:
    """Equal JSON values: numbers by value (1 = 1.0), but a boolean is never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# -- labels -----------------------------------------------------------------------------------


def _is_label(text: str) -> bool:
    """A few words and no digits: a name or a class, not a quantity."""
    words = text.removesuffix(".").split()
    return 0 < len(words) <= _MAX_LABEL_WORDS and not any(c.isdigit() for c in text)


def _phrase(text: str, phrase: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(phrase)}(?!\w)", text))


def options_of(prompt: str, label: str) -> list[str]:
    """The options listed with ``label`` in the prompt ("positive, negative or neutral"), as
    plain text; empty when the prompt lists none. The first and last items of a list are cut to
    the length of their neighbours, so "Is it spam or ham?" gives ``["spam", "ham"]``."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    for piece in re.split(r"[.?!:;\n()\[\]\"]", text):
        parts = [plain(p).split() for p in re.split(r",|/|\bor\b|\band\b", piece)]
        parts = [p for p in parts if p]
        if len(parts) < 2:
            continue
        parts[0] = parts[0][-len(parts[1]) :]
        parts[-1] = parts[-1][: len(parts[-2])]
        options = [" ".join(p) for p in parts]
        if label in options:
            return options
    return []


def _names_label(answer: str, label: str, prompt: str) -> bool:
    words = answer.split()
    if not words or len(words) > _MAX_LABEL_ANSWER_WORDS or _NEGATION & set(words):
        return False
    if _phrase(answer, label) != 1:
        return False
    others = [o for o in options_of(prompt, label) if o != label and label not in o.split()]
    return not any(_phrase(answer, other) for other in others)


# -- reading messages and completions ----------------------------------------------------------


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def request_text(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the last user message: where the question and its options are."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def answer_text(completion: dict[str, Any]) -> str:
    """The answer of an OpenAI chat completion as one text: the message content, or its tool
    calls as a JSON list of ``{"name", "arguments"}`` (arguments parsed when they are JSON)."""
    try:
        message = completion["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return ""
    if not isinstance(message, dict):
        return ""
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out = []
        for call in calls:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            arguments = function.get("arguments", "")
            try:
                arguments = json.loads(arguments)
            except (TypeError, ValueError):
                pass
            out.append({"name": function.get("name"), "arguments": arguments})
        return json.dumps(out, ensure_ascii=False)
    return text_of(message.get("content"))
