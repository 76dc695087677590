"""The dev set graded for content only: the right content in any form, as a chat reader reads.

``devset.is_correct`` is strict about form: it wants the answer in the shape the prompt asked
for ("one word", "only the number", JSON, a numbered list, at most 30 words). A person reading
a chat takes "The capital of Japan is Tokyo." as a right answer to "Capital of Japan? One
word." This module grades the same prompts under that notion (``correctness = "content"`` of
``docs/audit.md``), from the same check specs, by its own rules:

``number``       the number the answer ends on, or the only number on its first line, is the
                 value ("only the number" is form).
``regex``        the pattern's content anywhere in the answer, not negated. When every
                 alternative of the pattern is anchored, form is taken out of it: the anchors
                 with the padding beside them (``^\\W*tokyo\\W*$`` finds "tokyo" as a word
                 anywhere), a numbered-list marker after a start anchor (``^\\s*1[.)]\\s*``),
                 and a comma between items (any separator will do: spaces, commas, "and", a
                 new list line). A pattern with unanchored alternatives already lists the prose
                 forms it takes, and is kept as it is. A pattern with no letter or digit of its
                 own tests form (one word, three lines, under 280 characters) and is dropped,
                 unless it only looks at how the answer ends (cut off mid-sentence is not a
                 whole answer). Case rules stay: a case-sensitive pattern wants those letters
                 ("Au", "BANANA"). A match right after "not", "never", "isn't"... (one word
                 between at most) does not count, and for a yes/no or true/false answer the
                 opposite word must not come first.
``json``         the expected values as JSON anywhere (bare, fenced, inside prose), or every
                 expected value named in an answer without code (a program that would build
                 the object states none of its values); a schema alone: JSON anywhere that
                 fits it.
``writing``      keywords, language, no loop, not a copy of the source; ``max_words`` (the
                 length asked for) is dropped, but a summary stays shorter than its source
                 (or within the length asked).
``list_items``,  form only: dropped.
``word_count``
``label``,       as strict (they already read content: the first label named, the last
``last_of``,     option named, the terms present, the function run on its cases); ``not``
``count_of``,    checks (contradictions the strict grader refuses) are kept as they are.
``contains_all``,
``python_function``,
``not``
``all``          every check that is left; when nothing is left (a prompt that asks for a form
                 and nothing else, e.g. "describe the Moon in at most 5 words"), the strict
                 checker grades it: the form is then all there is to get right.
``extract``      the inner check, relaxed, on the answer with the source text taken out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from quality import schema as schema_mod
from quality.dev import devset

_PADDING = r"(?:\\[Ws]\*)?"
_START = re.compile(r"^\^" + _PADDING + r"(?:\d\[\.\)\]\\s\*)?")
_END = re.compile(r"(?<!\\)" + _PADDING + r"\$$")
_COMMA = ",\\s*"
_SEPARATOR = r"(?:[\s,;/&*•-]|\n\s*\d+[.)]|\band\b)+"
_NEGATION = re.compile(
    r"\b(?:not|never|isn't|isnt|aren't|arent|wasn't|doesn't|don't|cannot|can't)\s+(?:\w+\s+)?$"
)
_CODE = re.compile(r"```")
_POLAR = {"yes": "no", "no": "yes", "true": "false", "false": "true"}


# -- patterns ----------------------------------------------------------------------------------


def _alternatives(pattern: str) -> list[str]:
    """The pattern split at its top-level ``|`` (not inside a group, a class, or escaped)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # "[]...]": a literal "]" first
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _literals(pattern: str) -> str:
    """The letters and digits a pattern asks for itself: escapes, classes, group prefixes and
    repeat counts taken out."""
    text = re.sub(r"\\[UuxN]\w+|\\.", " ", pattern)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\(\?(?:[:=!]|<[=!]|P?<\w+>|[a-z]+\))", " ", text)
    text = re.sub(r"\{\d*,?\d*\}", " ", text)
    return "".join(ch for ch in text if ch.isalnum())


def relax(pattern: str) -> str | None:
    """The content of a check's regex with its form taken out; None when it tests form only.

    Only a pattern whose every alternative is anchored asks for a form ("one word", "only
    the answer"); one that also has unanchored alternatives lists the prose forms it accepts
    itself, and is kept as it is. A pattern with no letter or digit of its own tests form (one
    word, three lines, 280 characters), unless it only looks at how the answer ends (every
    alternative anchored at the end, none at the start): an answer cut off mid-sentence is
    not a whole answer."""
    alternatives = _alternatives(pattern)
    starts = [_START.match(a) for a in alternatives]
    ends = [_END.search(a) for a in alternatives]
    if not _literals(pattern):
        ends_only = all(ends) and not any(starts)
        return pattern if ends_only else None
    if not all(s or e for s, e in zip(starts, ends, strict=True)):
        return pattern
    out = []
    for alt, start, end in zip(alternatives, starts, ends, strict=True):
        body = alt[: end.start()] if end else alt
        body = body[start.end() :] if start else body
        body = body.replace(_COMMA, _SEPARATOR)
        out.append(rf"(?<!\w)(?:{body})(?!\w)")
    return "|".join(out)


def _found(pattern: str, flags: int, answer: str) -> bool:
    """A match of ``pattern`` in ``answer`` that no negation comes right before, and for a
    polar answer (yes/no, true/false), no opposite word before it."""
    for m in re.finditer(pattern, answer, flags):
        if _NEGATION.search(answer[max(0, m.start() - 40) : m.start()].lower()):
            continue
        said = m.group(0).strip(" \t\n.,!*_'\"").lower()
        opposite = _POLAR.get(said)
        if opposite and re.search(rf"\b{opposite}\b", answer[: m.start()], re.I):
            continue
        return True
    return False


# -- JSON --------------------------------------------------------------------------------------


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _named(answer: str, value: Any) -> bool:
    """A JSON leaf said in prose: a number by value, a string as words, a boolean as itself."""
    if isinstance(value, bool):
        return re.search(rf"\b{str(value).lower()}\b", answer, re.I) is not None
    if isinstance(value, int | float):
        return any(v == float(value) for _, v in devset._numbers(answer))
    if value is None:
        return re.search(r"\b(null|none)\b", answer, re.I) is not None
    text = str(value).strip()
    return bool(text) and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", answer, re.I) is not None


def _json_content(answer: str, spec: dict[str, Any]) -> bool:
    want = spec.get("values")
    schema = spec.get("schema")
    for value in schema_mod.json_values(answer):
        if schema is not None and schema_mod.validate(value, schema) is not True:
            continue
        if want is None or devset._same(value, want):
            return True
    if want is None or _CODE.search(answer):
        return False  # code that would build the object states none of its values
    return all(_named(answer, leaf) for leaf in _leaves(want))


# -- checks ------------------------------------------------------------------------------------


def _relaxed(check: dict[str, Any]) -> dict[str, Any] | None:
    """The check's content part as a check, or None when it tests form only."""
    kind = check["type"]
    if kind in ("list_items", "word_count"):
        return None
    if kind == "regex":
        pattern = relax(check["pattern"])
        return None if pattern is None else {**check, "type": "content_regex", "pattern": pattern}
    if kind == "number":
        return {**check, "mode": "last"}
    if kind == "json":
        return {**check, "type": "content_json"}
    if kind == "writing":
        spec = {k: v for k, v in check.items() if k != "max_words"}
        source = check.get("not_a_copy_of")
        if source is not None:  # a summary is shorter than its text, whatever length was asked
            shorter = len(devset._WORDS.findall(source)) - 1
            spec["max_words"] = max(shorter, check.get("max_words", shorter))
        return spec
    if kind == "extract":
        inner = _relaxed(check["check"])
        return None if inner is None else {**check, "check": inner}
    if kind == "all":
        kept = [c for c in (_relaxed(c) for c in check["checks"]) if c is not None]
        return {**check, "checks": kept} if kept else None
    return check


def _passes(check: dict[str, Any], answer: str) -> bool:
    kind = check["type"]
    if kind == "content_regex":
        return _found(check["pattern"], devset._flags(check.get("flags", "i")), answer)
    if kind == "content_json":
        return _json_content(answer, check)
    if kind == "extract":
        return _passes(check["check"], devset.without_source(answer, check["source"]))
    if kind == "all":
        return all(_passes(c, answer) for c in check["checks"])
    return devset.is_correct(check, answer)


def form_only(check: dict[str, Any]) -> bool:
    """True when the check has no content part: the strict checker grades such a prompt."""
    return _relaxed(check) is None


def is_content_correct(check: dict[str, Any], answer: str) -> bool:
    """Is ``answer`` right in content, whatever its form (see the module's rules)?"""
    relaxed = _relaxed(check)
    if relaxed is None:
        return devset.is_correct(check, answer)
    return _passes(relaxed, answer)
