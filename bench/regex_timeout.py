"""Matching client regexes with a time limit: ``python bench/regex_timeout.py``.

A JSON Schema ``pattern`` comes from the client and is matched against the model's answer, so a
catastrophic pattern (``^(a+)+$`` against ``"aaaa…b"``) must not hold the scorer. Two ways to
bound it, compared here against the standard library's ``re`` (no bound at all):

- the ``regex`` module: the same backtracking engine family as ``re``, with ``timeout=`` seconds;
- RE2 (``google-re2``): a linear-time automaton, so no timeout is needed, but no backreferences
  or lookarounds (such patterns do not compile).

For a few patterns typical of tool and ``response_format`` schemas it prints the compile time and
the per-match time in microseconds (compiled pattern cached, as the validator caches it), then
how long each engine takes to settle the ReDoS pattern on 30 and 5,000 characters, and what
compiling ``((a{100}){100}){100}`` costs each in a fresh process. ``re`` is not run on the ReDoS
case (it would take hours). Needs ``regex`` and ``google-re2`` installed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable

import re2
import regex

TIMEOUT_S = 0.05
NORMAL: list[tuple[str, str, str]] = [
    ("country code", r"^[A-Z]{2}$", "FR"),
    ("ISO date", r"^\d{4}-\d{2}-\d{2}$", "2024-05-17"),
    ("e-mail", r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$", "ada.lovelace@example.org"),
    ("E.164 phone", r"^\+?[1-9]\d{1,14}$", "+441632960961"),
    (
        "UUID",
        r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        "123e4567-e89b-12d3-a456-426614174000",
    ),
    ("slug, 2 KB text", r"^[a-z0-9]+(?:-[a-z0-9]+)*$", "-".join(["word"] * 400)),
    ("unanchored word", r"refund", "Please process the " * 20 + "refund now."),
]
REDOS = r"^(a|a)+$"
BOMB = r"((a{100}){100}){100}"
COMPILE_BOMB = """
import resource, sys, time
import MODULE
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    MODULE.compile(sys.argv[1])
    outcome = "compiled"
except Exception:
    outcome = "refused"
ms = (time.perf_counter() - start) * 1e3
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(f"{outcome} in {ms:.1f} ms, peak RSS +{grew:.0f} MB")
"""


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    """Mean microseconds per call of ``fn``, over about ``seconds`` of calls."""
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        calls += 100
        now = time.perf_counter()
        if now >= deadline:
            return (now - start) / calls * 1e6


def compile_us(compile_fn: Callable[[str], object], pattern: str, seconds: float) -> float:
    """Compile time without the engine's own cache: a fresh pattern text each call."""
    counter = iter(range(10**9))
    return per_call_us(lambda: compile_fn(f"{pattern}|(?:x{next(counter)}y)"), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    args = parser.parse_args()
    s = args.seconds
    head = f"{'compile µs: re / regex / re2':>30} {'match µs: re / regex+timeout / re2':>38}"
    print(f"{'pattern':<18} {head}")
    for label, pattern, text in NORMAL:
        p_re, p_rx, p_re2 = re.compile(pattern), regex.compile(pattern), re2.compile(pattern)
        assert p_re.search(text) and p_rx.search(text, timeout=TIMEOUT_S) and p_re2.search(text)
        c = [
            compile_us(re.compile, pattern, s),
            compile_us(regex.compile, pattern, s),
            compile_us(re2.compile, pattern, s),
        ]
        m = [
            per_call_us(lambda p=p_re, t=text: p.search(t), s),
            per_call_us(lambda p=p_rx, t=text: p.search(t, timeout=TIMEOUT_S), s),
            per_call_us(lambda p=p_re2, t=text: p.search(t), s),
        ]
        print(
            f"{label:<18} {c[0]:>9.1f} / {c[1]:>7.1f} / {c[2]:>7.1f}"
            f"      {m[0]:>9.2f} / {m[1]:>9.2f} / {m[2]:>9.2f}"
        )
    rx, r2 = regex.compile(REDOS), re2.compile(REDOS)
    for n in (30, 5000):
        text = "a" * n + "b"
        start = time.perf_counter()
        try:
            rx.search(text, timeout=TIMEOUT_S)
            rx_result = "finished"
        except TimeoutError:
            rx_result = "timed out"
        rx_ms = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        r2_result = "no match" if r2.search(text) is None else "match"
        r2_ms = (time.perf_counter() - start) * 1e3
        print(
            f"ReDoS {REDOS} on {n + 1} chars: regex {rx_result} after {rx_ms:.1f} ms; "
            f"re2 {r2_result} in {r2_ms:.3f} ms"
        )
    for module in ("regex", "re2"):
        code = COMPILE_BOMB.replace("MODULE", module)
        run = subprocess.run([sys.executable, "-c", code, BOMB], capture_output=True, text=True)
        print(f"{module}.compile({BOMB}): {run.stdout.strip()}")
    options = re2.Options()
    options.log_errors = False
    for construct in (r"^(\w)\1$", r"^(?=.*\d).+$", r"^(?!x).+$"):
        try:
            re2.compile(construct, options)
            verdict = "compiles"
        except re2.error:
            verdict = "does not compile"
        print(f"re2 on {construct}: {verdict}; regex: compiles")


if __name__ == "__main__":
    main()
