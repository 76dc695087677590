"""The code signal's evaluator (quality/code_eval.py): small pure Python expressions evaluated
without ``eval``, and nothing big built from a prompt."""

from __future__ import annotations

import pytest

from quality.code_eval import evaluate


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("len('hello')", 5),
        ("3 * 'ab'", "ababab"),
        ("'abc'.upper()", "ABC"),
        ("bool([])", False),
        ("10 // 3", 3),
        ("2 ** 10", 1024),
        ("[1, 2, 3][-1]", 3),
        ("'hello'[1:3]", "el"),
        ("sorted([3, 1, 2])", [1, 2, 3]),
        ("', '.join(['a', 'b'])", "a, b"),
        ("type(3.5)", float),
        ("1 < 2 < 3", True),
        ("len(list(range(4)))", 4),
    ],
)
def test_small_pure_expressions_are_evaluated(source: str, value: object) -> None:
    assert evaluate(source) == (True, value)


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os').system('true')",  # not a listed function
        "open('/etc/passwd').read()",
        "(1).__class__",  # attributes other than listed methods
        "'a' * 10**9",  # the size limits hold before anything big is built
        "9 ** 9 ** 9",
        "list(range(10**9))",
        "1 / 0",
        "x + 1",  # names are not known
        "print('hi')",
    ],
)
def test_anything_else_is_not_evaluated(source: str) -> None:
    assert evaluate(source) == (False, None)


# --- bounds: nothing big is built from a prompt ----------------------------------------------

BOMBS = [
    "'a'.zfill(3000000000)",
    "'%3000000000d' % 1",
    "'%(k(x)s)3000000000d' % {'k(x)s': 1}",  # a nested mapping key hides the width from a regex
    "'%*d' % (3000000000, 1)",
    "('%999d' * 200) % tuple(range(200))",
    "'{:>3000000000}'.format(1)",
    "f'{1:>3000000000}'",
    "'a'.ljust(3000000000)",
    "'a'.rjust(3000000000)",
    "'a'.center(3000000000)",
    "[0] * 10**10",
    "[[0] * 1000] * 1000",
    "str([['a' * 1000] * 100] * 100)",  # each list is short; what str() would print is not
    "''.join(['a' * 1000] * 1000)",
    "('a' * 1000).replace('', 'b' * 1000)",
    "sum([[0] * 100] * 1000, [])",
    "2 ** 10 ** 10",
    "1 << 10 ** 10",
    "round(1, -10 ** 18)",
    "list(range(10 ** 10))",
]


@pytest.mark.parametrize("source", BOMBS)
def test_an_expression_whose_value_would_be_huge_is_not_evaluated(source: str) -> None:
    assert evaluate(source) == (False, None)


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("'%5d|%-3s|%.2f' % (42, 'ab', 3.14159)", "   42|ab |3.14"),
        ("'%(n)s' % {'n': 7}", "7"),
        ("'7'.zfill(3)", "007"),
        ("'-'.join(['a', 'b', 'c'])", "a-b-c"),
        ("'a.b.c'.replace('.', '::')", "a::b::c"),
        ("sum([1, 2.5, 3])", 6.5),
        ("round(3.14159, 2)", 3.14),
        ("[[1, 2]] * 3", [[1, 2], [1, 2], [1, 2]]),
    ],
)
def test_the_same_operations_on_small_values_are_still_evaluated(
    source: str, value: object
) -> None:
    assert evaluate(source) == (True, value)
