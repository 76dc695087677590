"""The exact check: it says "correct" only when sure, under each notion of correctness."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from proxy.audit.verdict import (
    answer_text,
    bare_number,
    exact_check,
    find_json,
    numbers_in,
    options_of,
    request_text,
    same_json,
)

SENTIMENT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Is this review positive, negative or neutral? 'Great food.'"},
]

# (reference, candidate, strict, content): the rule that matches, or None (not decided).
CASES: list[tuple[str, str, str | None, str | None]] = [
    # text
    ("Paris", "Paris", "text", "text"),
    ("The capital is  Paris.\n", "The capital is Paris.", "text", "text"),
    ("Paris", "paris", None, "text"),
    ("Paris", "**Paris**", None, "text"),
    ("Paris", "Paris.", "label", "text"),
    ("Paris", "Lyon", None, None),
    ("", "", None, None),
    # numbers
    ("42", "42.0", "number", "text"),
    ("1,000", "1000", "number", "text"),
    ("-3", "3", None, None),
    ("2.5", "25", None, None),
    ("42", "The answer is 42.", None, "number"),
    ("The answer is 42.", "42", None, "number"),
    ("42", "6 times 7 is 42", None, None),
    ("42", "41", None, None),
    ("-3", "\u22123", "number", "text"),
    ("42", "42 or 43", None, None),
    # JSON
    ('{"a": 1, "b": [1, 2]}', '{"b": [1, 2], "a": 1.0}', "json", "json"),
    ('{"a": 1}', 'Here it is:\n```json\n{"a": 1}\n```', None, "json"),
    ('```json\n{"a": 1}\n```', '```\n{"a": 1}\n```', "json", "json"),
    ('{"a": true}', '{"a": 1}', None, None),
    ('{"a": 1}', '{"a": 1, "b": 2}', None, None),
    ("[1, 2]", "[2, 1]", None, None),
    # labels (options read from the request)
    ("positive", "Positive", None, "text"),
    ("positive", "The review is positive.", None, "label"),
    ("positive", "Positive and negative", None, None),
    ("positive", "It is not positive.", None, None),
    ("positive", "positive positive", None, None),
    ("positive", "negative", None, None),
    ("Option 2", "Option 3", None, None),
    ("Option 2", "I pick option 2 and option 3", None, None),
    (
        "positive",
        "Since the reviewer says the food was great, I would say that the overall tone is positive",
        None,
        None,
    ),
]


@pytest.mark.parametrize(("reference", "candidate", "strict", "content"), CASES)
def test_exact_check(
    reference: str, candidate: str, strict: str | None, content: str | None
) -> None:
    assert exact_check(reference, candidate, correctness="strict", request=SENTIMENT) == strict
    assert exact_check(reference, candidate, correctness="content", request=SENTIMENT) == content


def test_strict_never_matches_where_content_does_not() -> None:
    """Strict is the stricter notion: whatever it calls correct, content calls correct too."""
    for reference, candidate, strict, content in CASES:
        if strict is not None:
            assert content is not None, (reference, candidate)


def test_an_unknown_notion_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="lenient"):
        exact_check("a", "a", correctness="lenient")


def test_numbers() -> None:
    assert bare_number(" 3.50. ") == Decimal("3.5")
    assert bare_number("3.5 apples") is None
    assert bare_number("v2") is None
    assert numbers_in("From 1,200 to 3.5, not v2 or 1.2.3") == [Decimal(1200), Decimal("3.5")]


def test_find_json_reads_prose_fences_and_spans() -> None:
    assert find_json('{"a": 1}') == {"a": 1}
    assert find_json('Sure! {"a": [1]} Hope that helps.') == {"a": [1]}
    assert find_json("```json\n[1, 2]\n```") == [1, 2]
    assert find_json("a {broken json") is None
    assert find_json("just 42") is None


def test_same_json_keeps_booleans_apart_from_numbers() -> None:
    assert same_json({"x": [1, {"y": None}]}, {"x": [1.0, {"y": None}]})
    assert not same_json(True, 1)
    assert not same_json(0, False)
    assert not same_json("1", 1)


def test_options_are_read_from_the_request() -> None:
    prompt = request_text(SENTIMENT)
    assert options_of(prompt, "positive") == ["positive", "negative", "neutral"]
    assert options_of("Is this spam or ham?", "ham") == ["spam", "ham"]
    assert options_of("Classify it: sports / politics / tech.", "tech") == [
        "sports",
        "politics",
        "tech",
    ]
    assert options_of("What is the capital of France?", "paris") == []


def test_without_a_list_of_options_a_short_plain_mention_is_enough() -> None:
    request = [{"role": "user", "content": "What is the capital of France?"}]
    assert exact_check("Paris", "It's Paris.", correctness="content", request=request) == "label"
    assert exact_check("Paris", "Not Paris.", correctness="content", request=request) is None


def test_request_text_reads_the_last_user_message_and_its_text_parts() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url"}]},
    ]
    assert request_text(messages) == "second"
    assert request_text([]) == ""


def test_answer_text_of_content_and_of_tool_calls() -> None:
    plain = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    assert answer_text(plain) == "hi"
    call = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {"function": {"name": "get", "arguments": '{"city": "Paris"}'}},
                    ],
                }
            }
        ]
    }
    assert answer_text(call) == '[{"name": "get", "arguments": {"city": "Paris"}}]'
    same_call_other_spacing = answer_text(call).replace(": ", ":")
    assert exact_check(answer_text(call), same_call_other_spacing, correctness="strict") == "json"
    assert answer_text({}) == ""
    assert answer_text({"choices": []}) == ""
