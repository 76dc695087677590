"""Explicit answer-shape instructions in the prompt, checked cheaply against the answer.

Each check has a trigger (a pattern in the system or last user message) and a test of the
answer. A broken instruction is a fault, since the API would have kept it; but the triggers are
heuristics, so these failures feed the calibrated combiner (``fmt_fail``) rather than a hard gate.
Reasons are ``format:<check>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from quality._types import Signal
from quality._view import View

_NUMBERS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "twelve": 12,
    "fifteen": 15,
    "twenty": 20,
    "thirty": 30,
    "fifty": 50,
    "hundred": 100,
}
_NUM = r"(\d+|" + "|".join(_NUMBERS) + r")"

_WORD = re.compile(r"[\w'’-]+", re.UNICODE)
_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```$", re.S)
_NUMBER_ANSWER = re.compile(r"^[-+−]?[$€£]?\s?\d[\d,  ]*(?:\.\d+)?\s?%?$")
_SENTENCE_END = re.compile(r"[.!?。！？]+(?:\s+|$)")
_LIST_LINE = re.compile(r"^\s*(?:[-*•+]|\d+[.)])\s+\S")

T_ONE_WORD = re.compile(
    r"\b(?:in|with|using|as)\s+(?:only\s+|just\s+)?(?:one|a\s+single|1|a)\s+word\b"
    r"|\bone[- ]word\b|\bsingle[- ]word\b",
    re.I,
)
T_NUMBER = re.compile(
    r"\b(?:just|only)\s+(?:the|a)\s+(?:final\s+|resulting\s+)?(?:number|integer|numeric\s+\w+)\b"
    r"|\b(?:answer|reply|respond)\s+with\s+(?:only\s+|just\s+)?(?:a|the|one)\s+"
    r"(?:single\s+)?(?:number|integer)\b"
    r"|\bnumber\s+only\b|\bonly\s+(?:a\s+)?number\b|\bas\s+a\s+(?:single\s+)?number\b"
    r"|\bsingle\s+number\b",
    re.I,
)
_LONG_ANSWERS = (
    r"(?:number|integer|json|word|translation|code|sentence|summary|list|query|function|"
    r"paragraph|text|email|poem|letter|corrected|fixed|rewritten|steps?|answer)\b"
)
T_SHORT = re.compile(
    r"\b(?:answer|reply|respond)\s+(?:with\s+)?(?:only|just)\s+(?:the|a|an)\s+"
    rf"(?!{_LONG_ANSWERS})\w+"
    r"|\b(?:answer|reply|respond)\s+with\s+the\s+\w+(?:\s+\w+)?\s+only\b"
    rf"|\b(?:give|write|say)\s+(?:me\s+)?(?:only|just)\s+the\s+(?!{_LONG_ANSWERS})\w+\s*[,.;:!?]",
    re.I,
)
"""A bare answer asked for ("answer with the symbol only", "just the name, nothing else")."""
SHORT_MAX_WORDS = 6
T_YES_NO = re.compile(r"\byes\s+or\s+no\b|\b\"yes\"\s+or\s+\"no\"", re.I)
T_YES_NO_STRICT = re.compile(
    r"\b(?:only|just|exactly)\s+(?:with\s+)?\"?yes\"?\s+or\s+\"?no\b", re.I
)
T_COMMA = re.compile(r"\bcomma[- ]separated\b|\bseparated\s+by\s+commas\b", re.I)
_AT_MOST = (
    r"\b(?:at\s+most|no\s+more\s+than|not\s+more\s+than|fewer\s+than|less\s+than|under|"
    r"maximum\s+(?:of\s+)?|max\.?|up\s+to)"
)
"""An upper bound, as in "under 50 words", "at most 280 characters"."""
T_MAX_WORDS = re.compile(
    rf"{_AT_MOST}\s+{_NUM}\s+words\b"
    rf"|\b(?:in\s+)?{_NUM}\s+words\s+or\s+(?:less|fewer)\b",
    re.I,
)
T_EXACT_WORDS = re.compile(rf"\b(?:in|with|using)\s+exactly\s+{_NUM}\s+words\b", re.I)
T_SENTENCES = re.compile(
    rf"\b(?:in|with|using|as)\s+(?:exactly\s+|only\s+|just\s+)?(?:a\s+single|{_NUM})\s+sentences?\b"
    rf"|\bone[- ]sentence\b",
    re.I,
)
T_SENTENCE_COUNT = re.compile(
    rf"\b(?:write|give|compose|tell)\s+(?:me\s+|us\s+)?(?:exactly\s+|only\s+|just\s+)?{_NUM}\s+"
    r"(?:short\s+|full\s+|complete\s+|simple\s+)?sentences?\b"
    rf"|\b{_NUM}-sentences?\b",
    re.I,
)
"""A number of sentences to write ("write two sentences", "a three-sentence story"): the count is
the task, not only an upper bound."""
MAX_OPTIONS = 20
T_LABELS = (
    re.compile(
        r"\b(?:one\s+of|choose\s+(?:from|between|among)|pick\s+(?:from|one\s+of)|"
        r"(?:labels?|options?|categories)\s*(?:are|:))\s*:?\s*\[?([^.\n\]?]+)",
        re.I,
    ),
    re.compile(
        r"\b(?:classify|label|categori[sz]e|tag)\b[^.?\n]*?\b(?:as|into)\s+(?:either\s+)?"
        r"((?:[\"']?[\w-]+[\"']?,\s*)*[\"']?[\w-]+[\"']?,?\s+or\s+[\"']?[\w-]+[\"']?)",
        re.I,
    ),
    re.compile(r"\b(true\s+or\s+false)\b", re.I),
    # from a word's start only, and at most MAX_OPTIONS options: unbounded, a long run of
    # words or digits with no "or" made this search quadratic (seconds for a 16,000-character
    # prompt)
    re.compile(
        rf"(?<![\w-])((?:[\w-]+,\s*){{0,{MAX_OPTIONS}}}(?:an?\s+)?[\w-]+,?\s+or\s+(?:an?\s+)?"
        r"[\w-]+)\s*\?",
        re.I,
    ),
)
T_JSON = re.compile(
    r"\b(?:respond|reply|answer|output|return|format|give)\b[^.\n]{0,40}?\b(?:in|as|with)\s+"
    r"(?:a\s+|an\s+)?(?:valid\s+)?json\b|\bjson\s+only\b|\bonly\s+(?:valid\s+)?json\b",
    re.I,
)
T_LOWER = re.compile(r"\b(?:in\s+)?(?:all\s+)?lower[- ]?case\b", re.I)
T_UPPER = re.compile(r"\b(?:in\s+)?(?:all\s+caps|all\s+capital\s+letters|all\s+uppercase)\b", re.I)
T_COUNT = re.compile(
    rf"\b(?:give|list|name|write|suggest|share|provide|offer)\s+(?:me\s+|us\s+)?(?:exactly\s+)?"
    rf"{_NUM}\s+(?:[\w-]+\s+){{0,2}}?(?:tips|ideas|ways|reasons|examples|items|things|names|"
    rf"facts|steps|benefits|questions|advantages|rules|suggestions|points)\b",
    re.I,
)
"""A number of items asked for: checked only when the answer is a list (two list lines or more),
since prose can hold any number of items."""
_QUOTED_WORD = r"[\"'‘“]?([\w-]+)[\"'’”]?"
T_INCLUDE = re.compile(
    r"(?<!n't )(?<!not )(?<!never )(?<!without )"
    rf"\b(?:includes?|including|uses?|using|contains?|containing|with)\s+the\s+words?\s+{_QUOTED_WORD}",
    re.I,
)
T_AVOID = re.compile(
    rf"\b(?:don'?t|do\s+not|never|without)\s+(?:use|using|say|saying|mention|mentioning|include|"
    rf"including)?\s*the\s+words?\s+{_QUOTED_WORD}|\bavoid\s+(?:using\s+)?the\s+words?\s+"
    rf"{_QUOTED_WORD}",
    re.I,
)
T_MAX_CHARS = re.compile(rf"{_AT_MOST}\s+{_NUM}\s+(?:characters|chars)\b", re.I)
T_LINES = re.compile(
    rf"\b{_NUM}[- ]line\s+(?:poem|verse|stanza|rhyme|song)\b|\b(haiku|limerick)\b", re.I
)
_FORM_LINES = {"haiku": 3, "limerick": 5}
T_LIST = re.compile(r"\b(?:bullet(?:ed)?\s+(?:list|points)|as\s+a\s+(?:numbered\s+)?list)\b", re.I)


def _num(text: str) -> int:
    return int(text) if text.isdigit() else _NUMBERS[text.lower()]


def _bare(answer: str) -> str:
    """The answer without surrounding quotes, markdown emphasis and end punctuation."""
    return answer.strip().strip("\"'`*_ ").rstrip(".!。").strip()


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _check_one_word(answer: str, _: re.Match[str]) -> bool:
    return len(_words(_bare(answer))) == 1


def _check_number(answer: str, _: re.Match[str]) -> bool:
    return bool(_NUMBER_ANSWER.match(_bare(answer)))


def _check_short(answer: str, _: re.Match[str]) -> bool:
    body = _bare(answer)
    return "\n" not in body and len(_words(body)) <= SHORT_MAX_WORDS


def _check_comma(answer: str, _: re.Match[str]) -> bool:
    body = answer.strip()
    return "\n" not in body and "," in body


def _check_max_words(answer: str, match: re.Match[str]) -> bool:
    n = _num(next(g for g in match.groups() if g))
    strict = re.search(r"fewer\s+than|less\s+than", match.group(0), re.I) is not None
    count = len(_words(answer))
    return count < n if strict else count <= n


def _sentences(answer: str) -> int:
    return sum(1 for p in _SENTENCE_END.split(answer.strip()) if p.strip())


def _check_sentences(answer: str, match: re.Match[str]) -> bool:
    groups = [g for g in match.groups() if g]
    return _sentences(answer) <= (_num(groups[0]) if groups else 1)


def _check_sentence_count(answer: str, match: re.Match[str]) -> bool:
    return _sentences(answer) == _num(next(g for g in match.groups() if g))


def _check_exact_words(answer: str, match: re.Match[str]) -> bool:
    return len(_words(answer)) == _num(next(g for g in match.groups() if g))


def _check_lower(answer: str, _: re.Match[str]) -> bool:
    letters = [c for c in answer if c.isalpha()]
    return bool(letters) and not any(c.isupper() for c in letters)


def _check_upper(answer: str, _: re.Match[str]) -> bool:
    letters = [c for c in answer if c.isalpha()]
    return bool(letters) and all(c.isupper() for c in letters)


def _check_list(answer: str, _: re.Match[str]) -> bool:
    return sum(1 for line in answer.splitlines() if _LIST_LINE.match(line)) >= 2


def _check_count(answer: str, match: re.Match[str]) -> bool:
    items = sum(1 for line in answer.splitlines() if _LIST_LINE.match(line))
    return items < 2 or items == _num(match.group(1))


def _word_in(word: str, answer: str) -> bool:
    return re.search(rf"\b{re.escape(word)}", answer, re.I) is not None


def _check_include(answer: str, match: re.Match[str]) -> bool:
    return _word_in(match.group(1), answer)


def _check_avoid(answer: str, match: re.Match[str]) -> bool:
    return not _word_in(next(g for g in match.groups() if g), answer)


def _check_max_chars(answer: str, match: re.Match[str]) -> bool:
    return len(answer.strip()) <= _num(match.group(1))


def _check_lines(answer: str, match: re.Match[str]) -> bool:
    form = match.group(2)
    wanted = _FORM_LINES[form.lower()] if form else _num(match.group(1))
    body = answer.strip()
    fenced = _FENCE.match(body)
    lines = [line for line in (fenced.group(1) if fenced else body).splitlines() if line.strip()]
    # a title line, or a closing remark after the poem, is common and harmless
    return len(lines) > 1 and wanted <= len(lines) <= wanted + 1


def _check_json(answer: str, _: re.Match[str]) -> bool:
    body = answer.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


_CHECKS: tuple[tuple[str, re.Pattern[str], Callable[[str, re.Match[str]], bool]], ...] = (
    ("one_word", T_ONE_WORD, _check_one_word),
    ("number", T_NUMBER, _check_number),
    ("short", T_SHORT, _check_short),
    ("comma_separated", T_COMMA, _check_comma),
    ("max_words", T_MAX_WORDS, _check_max_words),
    ("exact_words", T_EXACT_WORDS, _check_exact_words),
    ("sentences", T_SENTENCES, _check_sentences),
    ("sentence_count", T_SENTENCE_COUNT, _check_sentence_count),
    ("uppercase", T_UPPER, _check_upper),
    ("lowercase", T_LOWER, _check_lower),
    ("list", T_LIST, _check_list),
    ("count", T_COUNT, _check_count),
    ("include_word", T_INCLUDE, _check_include),
    ("avoid_word", T_AVOID, _check_avoid),
    ("max_chars", T_MAX_CHARS, _check_max_chars),
    ("lines", T_LINES, _check_lines),
    ("json", T_JSON, _check_json),
)


def _labels(instructions: str) -> list[str] | None:
    for pattern in T_LABELS:
        match = pattern.search(instructions)
        if match:
            raw = re.split(r",|/|\bor\b|\|", match.group(1))
            labels = [re.sub(r"[^\w\s-]", "", x).strip().lower() for x in raw]
            labels = [re.sub(r"^(?:an?|the|either)\s+", "", x) for x in labels]
            labels = [x for x in labels if x and len(x.split()) <= 3]
            if len(labels) >= 2:
                return labels
    return None


LABEL_SPAN = 25
"""An answer to a choice must name one of the options early: within this many words."""


def _check_labels(answer: str, labels: list[str]) -> bool:
    bare = _bare(answer).lower()
    if bare in labels:
        return True
    head = " ".join(_words(bare)[:LABEL_SPAN])
    return any(re.search(rf"\b{re.escape(lab)}s?\b", head) for lab in labels)


def _check_yes_no(answer: str, strict: bool) -> bool:
    words = [w.lower() for w in _words(answer)]
    if not words or words[0] not in ("yes", "no"):
        return False
    return len(words) == 1 if strict else True


def failed_instructions(instructions: str, answer: str) -> tuple[list[str], int]:
    """(names of the instructions the answer breaks, how many instructions were checked)."""
    failed: list[str] = []
    checked = 0
    json_asked = T_JSON.search(instructions) is not None
    for name, trigger, check in _CHECKS:
        if json_asked and name in ("one_word", "number", "comma_separated", "short"):
            continue  # "a JSON object with one word per field" is about the fields
        if name == "sentence_count" and T_SENTENCES.search(instructions):
            continue  # "write it in two sentences" is the upper bound already checked
        match = trigger.search(instructions)
        if match is None:
            continue
        checked += 1
        if not check(answer, match):
            failed.append(name)
    if T_YES_NO.search(instructions):
        checked += 1
        if not _check_yes_no(answer, T_YES_NO_STRICT.search(instructions) is not None):
            failed.append("yes_no")
    labels = None if json_asked else _labels(instructions)
    if labels is not None:
        checked += 1
        if not _check_labels(answer, labels):
            failed.append("label")
    return failed, checked


_NAME = "instructions"


def instruction_compliance(view: View) -> Signal:
    if view.tool_calls or not view.content.strip():
        return Signal(_NAME, applied=False)
    failed, checked = failed_instructions(view.instructions, view.content)
    if not checked:
        return Signal(_NAME, applied=False)
    soft = {f"format:{name}": "fmt_fail" for name in failed}
    features = {"fmt_fail": float(len(failed))}
    return Signal(_NAME, applied=True, features=features, soft=soft)
