"""The graded dev set: prompts with checkers that decide whether an answer is right.

``tests/data/quality_dev.jsonl`` holds one prompt a line: ``id``, ``kind``, ``split``
(``train`` for calibration, ``heldout`` for evaluation only), ``request`` (an OpenAI chat request
body) and ``check``. Checkers judge what a client would judge: is the answer right, and in the
shape that was asked for. They are strict about explicit formats (as the API would keep them)
and lenient about phrasing.

Check types: ``regex``, ``number``, ``label``, ``last_of``, ``count_of``, ``contains_all``,
``json``, ``list_items``, ``word_count``, ``writing``, ``python_function``, ``extract`` (the inner
check must pass on the answer with the quoted source text taken out: echoing the input is not
extracting), ``all``, ``not``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quality import language
from quality import schema as schema_mod
from quality.degeneration import repeat_ratio

DEV_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "quality_dev.jsonl"

_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\d])")
_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.I)
_FENCE = re.compile(r"```[\w+-]*\s*\n?(.*?)(?:```|$)", re.S)
_WORDS = re.compile(r"[\w'’-]+", re.UNICODE)
_LIST_LINE = re.compile(r"^\s*(?:[-*•+]|\d+[.)])\s+\S")


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    split: str
    request: dict[str, Any]
    check: dict[str, Any]


def load(path: str | Path = DEV_PATH) -> list[Prompt]:
    prompts = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                prompts.append(
                    Prompt(row["id"], row["kind"], row["split"], row["request"], row["check"])
                )
    return prompts


# --- checkers -----------------------------------------------------------------------------------


def _flags(spec: str) -> int:
    value = 0
    for ch in spec:
        value |= {"i": re.I, "m": re.M, "s": re.S}[ch]
    return value


def _numbers(text: str) -> Iterator[tuple[int, float]]:
    """(position, value) of every number written with digits or as a word up to twenty."""
    for m in _NUMBER.finditer(text):
        raw = m.group(0).replace("−", "-").replace(",", "")
        try:
            yield m.start(), float(raw)
        except ValueError:
            continue
    for m in _NUMBER_WORD.finditer(text):
        yield m.start(), float(_NUMBER_WORDS[m.group(1).lower()])


def _close(a: float, b: float, tol: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=max(tol, 1e-9))


def check_number(answer: str, value: float, mode: str = "last", tol: float = 0.0) -> bool:
    """``only``: the answer is just that number; ``last``: the final number stated is it, or the
    first line states that number and no other."""
    text = answer.strip()
    if mode == "only":
        bare = text.strip("\"'`*_ ").rstrip(".!").strip().lstrip("$€£").rstrip("%")
        try:
            return _close(float(bare.replace(",", "")), value, tol)
        except ValueError:
            return False
    found = sorted(_numbers(text))
    if not found:
        return False
    if _close(found[-1][1], value, tol):
        return True
    first_line = text.splitlines()[0] if text else ""
    in_first = {v for _, v in _numbers(first_line)}
    return len(in_first) == 1 and _close(in_first.pop(), value, tol)


def check_label(answer: str, correct: str, labels: list[str]) -> bool:
    """The first label the answer names is the right one ("health, not sports" is right)."""
    first: tuple[int, str] | None = None
    for lab in labels:
        m = re.search(rf"\b{re.escape(lab.lower())}s?\b", answer.lower())
        if m and (first is None or m.start() < first[0]):
            first = (m.start(), lab.lower())
    return first is not None and first[1] == correct.lower()


def _strip_fence(text: str) -> str:
    m = _FENCE.search(text)
    return m.group(1).strip() if m else text


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _same(got[k], v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(_same(g, w) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, int | float):
        if isinstance(got, str):
            try:
                got = float(got)
            except ValueError:
                return False
        return isinstance(got, int | float) and _close(float(got), float(want), 0.0)
    return isinstance(got, str | int | float) and str(got).strip().lower() == str(want).lower()


def check_json(answer: str, spec: dict[str, Any]) -> bool:
    text = answer.strip()
    if spec.get("fenced_ok"):
        text = _strip_fence(text)
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if "schema" in spec and schema_mod.validate(data, spec["schema"]) is not True:
        return False
    return "values" not in spec or _same(data, spec["values"])


def check_writing(answer: str, spec: dict[str, Any]) -> bool:
    text = answer.strip()
    words = _WORDS.findall(text)
    if not spec.get("min_words", 1) <= len(words) <= spec.get("max_words", 10**9):
        return False
    low = text.lower()
    hits = sum(1 for k in spec.get("keywords", []) if k.lower() in low)
    if hits < spec.get("min_keywords", 0):
        return False
    want = spec.get("language")
    if want and len(words) >= 8 and language.detect(text, min_hits=2) not in (want, None):
        return False
    if repeat_ratio(text) > spec.get("max_repeat", 1.0):
        return False
    source = spec.get("not_a_copy_of")
    return source is None or copied_share(source, text) < COPY_LIMIT


COPY_LIMIT = 0.8


def copied_share(source: str, answer: str, n: int = 4) -> float:
    """Share of the source's word n-grams that the answer repeats verbatim."""
    s = [w.lower() for w in _WORDS.findall(source)]
    a = [w.lower() for w in _WORDS.findall(answer)]
    src = {tuple(s[i : i + n]) for i in range(len(s) - n + 1)}
    ans = {tuple(a[i : i + n]) for i in range(len(a) - n + 1)}
    return len(src & ans) / len(src) if src else 0.0


def without_source(answer: str, source: str) -> str:
    """The answer with any verbatim copy of ``source`` (punctuation aside) taken out."""
    words = _WORDS.findall(source)
    if not words:
        return answer
    pattern = r"\W*".join(re.escape(w) for w in words)
    return re.sub(pattern, " ", answer, flags=re.I)


def last_of(answer: str, options: list[str]) -> str | None:
    """The option mentioned last in the answer (where reasoning ends up)."""
    best: tuple[int, str] | None = None
    for option in options:
        for m in re.finditer(rf"\b{re.escape(option)}\b", answer, re.I):
            if best is None or m.start() > best[0]:
                best = (m.start(), option.lower())
    return best[1] if best else None


_UNSAFE = re.compile(
    r"\b(?:import\s+(?:os|sys|subprocess|shutil|socket|pathlib)|from\s+(?:os|sys|subprocess|"
    r"shutil|socket|pathlib)\b|__import__|open\s*\(|exec\s*\(|eval\s*\()"
)


def _code_of(answer: str) -> str:
    blocks = _FENCE.findall(answer)
    if blocks:
        return "\n".join(b for b in blocks if "def " in b) or blocks[0]
    start = answer.find("def ")
    return answer[start:] if start >= 0 else answer


def check_python_function(answer: str, name: str, cases: list[Any], timeout: float = 5.0) -> bool:
    """Run the answer's function in a separate interpreter on ``cases`` ([[args], expected]).

    Code that imports os/sys/subprocess or opens files is not run and counts as wrong.
    """
    code = _code_of(answer)
    if f"def {name}" not in code or _UNSAFE.search(answer):
        return False
    harness = (
        code
        + "\n\nimport json as _json\n"
        + f"_cases = _json.loads({json.dumps(json.dumps(cases))})\n"
        + f"print(_json.dumps([{name}(*_a) == _w for _a, _w in _cases]))\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = subprocess.run(
                [sys.executable, "-I", "-c", harness],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
    if out.returncode != 0:
        return False
    try:
        results = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    return isinstance(results, list) and len(results) == len(cases) and all(results)


def is_correct(check: dict[str, Any], answer: str) -> bool:
    kind = check["type"]
    if kind == "regex":
        return (
            re.search(check["pattern"], answer.strip(), _flags(check.get("flags", "i"))) is not None
        )
    if kind == "number":
        return check_number(
            answer, check["value"], check.get("mode", "last"), check.get("tol", 0.0)
        )
    if kind == "label":
        return check_label(answer, check["answer"], check["labels"])
    if kind == "last_of":
        return last_of(answer, check["options"]) == str(check["answer"]).lower()
    if kind == "count_of":
        low = answer.lower()
        found = sum(1 for o in check["options"] if re.search(rf"\b{re.escape(o)}s?\b", low))
        return found >= int(check.get("min", 1))
    if kind == "extract":
        return is_correct(check["check"], without_source(answer, check["source"]))
    if kind == "contains_all":
        low = answer.lower()
        return all(term.lower() in low for term in check["terms"])
    if kind == "json":
        return check_json(answer, check)
    if kind == "list_items":
        n = sum(1 for line in answer.splitlines() if _LIST_LINE.match(line))
        return int(check.get("min", 1)) <= n <= int(check.get("max", 10**9))
    if kind == "word_count":
        n = len(_WORDS.findall(answer))
        return int(check.get("min", 0)) <= n <= int(check.get("max", 10**9))
    if kind == "writing":
        return check_writing(answer, check)
    if kind == "python_function":
        return check_python_function(answer, check["name"], check["cases"])
    if kind == "all":
        return all(is_correct(c, answer) for c in check["checks"])
    if kind == "not":
        return not is_correct(check["check"], answer)
    raise ValueError(f"unknown check type {kind!r}")


def answer_text(completion: dict[str, Any]) -> str:
    """The text a checker judges: the message content, or tool calls as JSON."""
    message = (completion.get("choices") or [{}])[0].get("message") or {}
    content = message.get("content")
    if isinstance(content, str):
        return content
    calls = message.get("tool_calls")
    return json.dumps(calls) if calls else ""
