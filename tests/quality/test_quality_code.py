"""The code signal: Python the gate can check itself, without running anything from the answer."""

from __future__ import annotations

import ast

import pytest

from quality import score
from quality._view import view_of
from quality.code_check import asked_expression, code_check, never_returns
from tests.conftest import fresh_python
from tests.quality.test_quality_code_eval import BOMBS
from tests.quality.test_quality_signals import completion, request

FACTORIAL_Q = "Write a Python function factorial(n) that returns n factorial."


def check(prompt: str, answer: str) -> tuple[tuple[str, ...], dict[str, float], bool]:
    sig = code_check(view_of(request(prompt), completion(answer)))
    return sig.hard, sig.features, sig.applied


def test_the_asked_expression_is_read_from_print_or_a_result_question() -> None:
    assert asked_expression("What does this Python code print? print(len('hello'))") == (
        "len('hello')",
        5,
        True,
    )
    assert asked_expression("What is the result of 'abc'.upper() in Python?") == (
        "'abc'.upper()",
        "ABC",
        False,
    )
    assert asked_expression("What does bool([]) return in Python?") == ("bool([])", False, False)
    assert asked_expression("What is the capital of France?") is None
    assert asked_expression("In Python, what is the result of a + b?") is None  # unknown names


@pytest.mark.parametrize(
    ("expression", "right", "wrong"),
    [
        (
            "3 * 'ab'",
            "It prints `ababab`: the string repeated three times.",
            "The output of `print(3 * 'ab')` will be `10`.",
        ),
        (  # restating the expression does not count as stating its value
            "10 // 3",
            "The output of `print(10 // 3)` in Python will be 3.",
            "The output of print(10 // 3) is the floor division of the numbers.",
        ),
    ],
)
def test_an_answer_that_does_not_state_the_printed_value_is_flagged(
    expression: str, right: str, wrong: str
) -> None:
    q = f"What is the output of print({expression}) in Python?"
    assert check(q, right)[1]["code_mismatch"] == 0.0
    assert check(q, wrong)[1]["code_mismatch"] == 1.0


def test_a_function_that_always_calls_itself_is_a_hard_failure() -> None:
    loop = "```python\ndef factorial(n):\n    return n * factorial(n - 1)\n```"
    fine = (
        "```python\ndef factorial(n):\n    if n <= 1:\n        return 1\n"
        "    return n * factorial(n - 1)\n```"
    )
    hard, _, _ = check(FACTORIAL_Q, loop)
    assert hard == ("code_never_returns",)
    assert check(FACTORIAL_Q, fine)[0] == ()
    s = score(request(FACTORIAL_Q), completion(loop))
    assert s.value <= 0.1
    assert s.reasons[0] == "code_never_returns"


def test_recursion_guarded_by_a_conditional_expression_or_boolean_is_not_flagged() -> None:
    guarded = "def f(n):\n    return 1 if n == 0 else n * f(n - 1)\n"
    short_circuit = "def g(xs):\n    return bool(xs) and g(xs[1:])\n"
    assert not never_returns(ast.parse(guarded))
    assert not never_returns(ast.parse(short_circuit))


def test_a_closed_python_block_that_does_not_parse_is_flagged_but_a_cut_one_is_not() -> None:
    q = "Write a Python function add(a, b)."
    _, broken, _ = check(q, "```python\ndef add(a, b)\n    return a + b\n```")
    _, cut, _ = check(q, "```python\ndef add(a, b):\n    return (a +")
    _, good, _ = check(q, "```python\ndef add(a, b):\n    return a + b\n```")
    assert broken["code_broken"] == 1.0
    assert cut["code_broken"] == 0.0
    assert good["code_broken"] == 0.0


def test_blocks_in_other_languages_are_left_alone() -> None:
    hard, features, applied = check(
        "What does the SQL keyword SELECT do?", "```sql\nSELECT * FROM t WHERE\n```"
    )
    assert not applied
    assert hard == ()
    assert features == {}


def test_the_signal_does_not_apply_without_code_or_an_expression() -> None:
    assert not check("What is the capital of France?", "Paris.")[2]


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("In Python, what is the value of " + "(" * 1600 + "1?", "1"),
        ("What does print(" + "(" * 3000 + "1" + ")" * 3000 + ") output in Python?", "1"),
        ("Fix the bug in this Python function.", "```python\n" + "(" * 5000 + "\n```"),
        ("Fix this: def f(x): return x", "```python\nx = " + "1+" * 20000 + "1\n```"),
        ("python " + "result of x " * 1300, "x"),
    ],
)
def test_python_nested_past_the_parser_limit_is_not_a_crash(prompt: str, answer: str) -> None:
    s = score(request(prompt), completion(answer))
    assert 0.0 <= s.value <= 1.0


def test_a_prompt_full_of_bombs_is_scored_in_bounded_memory() -> None:
    probe = """
import json, resource, sys
from quality import score
from tests.quality.test_quality_signals import completion, request
score(request("What does print(len('ab')) print in Python?"), completion("2"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for source in json.loads(sys.stdin.read()):
    prompt = f"What does this Python code print? print({source})"
    score(request(prompt), completion("It prints a very long string."))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    assert float(fresh_python(probe, BOMBS).strip().splitlines()[-1]) < 50
