"""The dev set's content-only grader (``quality.dev.content``), on made-up answers right and
wrong, and against the strict checkers on the bundled model's cached answers."""

from __future__ import annotations

from typing import Any

import pytest

from quality.dev import devset
from quality.dev.content import form_only, is_content_correct, relax
from quality.dev.local_answers import load_answers

ONE_WORD = {"type": "regex", "pattern": "^\\W*tokyo\\W*$", "flags": "i"}
PROSE_TOO = {
    "type": "regex",
    "pattern": "^\\W*(the\\s+)?heart\\b|\\b(is|it's)\\s+(the\\s+)?heart\\b",
    "flags": "i",
}
YES = {"type": "regex", "pattern": "^\\W*yes\\b", "flags": "i"}
DAYS = {"type": "regex", "pattern": "^\\W*monday,\\s*tuesday,\\s*wednesday\\W*$", "flags": "i"}
NUMBERED = {
    "type": "all",
    "checks": [
        {"type": "regex", "pattern": "^\\s*1[.)]\\s*10\\b", "flags": "im"},
        {"type": "regex", "pattern": "^\\s*2[.)]\\s*20\\b", "flags": "im"},
    ],
}
CAPITALS = {"type": "regex", "pattern": "^\\W*BANANA\\W*$", "flags": ""}
ONE_WORD_LABEL = {
    "type": "all",
    "checks": [
        {"type": "label", "answer": "vegetable", "labels": ["fruit", "vegetable"]},
        {"type": "regex", "pattern": "^\\W*\\w+\\W*$", "flags": "i"},
    ],
}
ONLY_NUMBER = {"type": "number", "value": 2, "mode": "only", "tol": 0.0}
CITY_JSON = {"type": "json", "fenced_ok": False, "values": {"city": "Madrid", "temp": 21}}
COLOURS_SCHEMA = {
    "type": "json",
    "schema": {
        "type": "object",
        "properties": {"colours": {"type": "array", "minItems": 3, "maxItems": 3}},
        "required": ["colours"],
    },
}
AT_MOST_5_WORDS = {"type": "word_count", "min": 1, "max": 5}
ENDS_WHOLE = {
    "type": "all",
    "checks": [
        {"type": "writing", "keywords": ["job"], "min_keywords": 1, "max_words": 8},
        {"type": "regex", "pattern": "[.!?]\\s*$", "flags": ""},
    ],
}
SOURCE = "The council closed the old pool on Elm Street because repairs would cost too much."
SUMMARY = {
    "type": "writing",
    "keywords": ["pool", "close", "council", "cost"],
    "min_keywords": 2,
    "min_words": 3,
    "max_words": 6,
    "not_a_copy_of": SOURCE,
}


@pytest.mark.parametrize(
    ("check", "answer"),
    [
        (ONE_WORD, "Tokyo"),
        (ONE_WORD, "The capital of Japan is Tokyo."),
        (PROSE_TOO, "It is the heart."),
        (YES, "The answer is yes: every bloop is a lazzie."),
        (DAYS, "Monday, Tuesday and Wednesday."),
        (DAYS, "1. Monday\n2. Tuesday\n3. Wednesday"),
        (NUMBERED, "10, 20"),
        (CAPITALS, "In capitals it is BANANA."),
        (ONE_WORD_LABEL, "A carrot is a vegetable."),
        (ONLY_NUMBER, "A bicycle has 2 wheels."),
        (ONLY_NUMBER, "A bicycle has two wheels."),
        (CITY_JSON, 'Here it is: {"city": "Madrid", "temp": 21} as asked.'),
        (CITY_JSON, "In Madrid it is 21 degrees today."),
        (COLOURS_SCHEMA, 'Sure!\n```json\n{"colours": ["red", "green", "blue"]}\n```'),
        (AT_MOST_5_WORDS, "A grey, cratered rock."),
        (ENDS_WHOLE, "Good luck in the new job, you will do great!"),
        (SUMMARY, "The council closed the pool: repairs cost too much."),
    ],
)
def test_right_content_in_any_form_is_right(check: dict[str, Any], answer: str) -> None:
    assert is_content_correct(check, answer)


@pytest.mark.parametrize(
    ("check", "answer"),
    [
        (ONE_WORD, "Kyoto."),
        (ONE_WORD, "It is not Tokyo, it is Kyoto."),
        (ONE_WORD, "Tokyoites live in Osaka."),
        # Unanchored alternatives list the prose forms the check takes: it is not relaxed.
        (PROSE_TOO, "The circulatory system includes the heart and the veins."),
        (YES, "No. Well, yes and no."),
        (DAYS, "Monday, Wednesday, Tuesday."),
        (NUMBERED, "1. 10\n2. 30"),
        (CAPITALS, "banana"),
        (ONE_WORD_LABEL, "A carrot is a fruit, not a vegetable."),
        (ONLY_NUMBER, "A bicycle has 2 wheels, a tricycle 3."),
        (CITY_JSON, "In Madrid it is 23 degrees today."),
        (CITY_JSON, "```python\nprint({'city': 'Madrid', 'temp': 21})\n```"),
        (COLOURS_SCHEMA, "Red, green and blue."),
        # A check of form alone is graded as strictly as before: the form is all there is.
        (AT_MOST_5_WORDS, "The Moon is a grey and cratered rock in the sky."),
        # Cut off mid-sentence: not a whole answer, whatever the length asked.
        (ENDS_WHOLE, "Good luck in the new job, you will"),
        # As long as its source: a copy, not a summary.
        (SUMMARY, SOURCE),
    ],
)
def test_wrong_or_contradicted_content_is_wrong(check: dict[str, Any], answer: str) -> None:
    assert not is_content_correct(check, answer)


def test_the_strict_checkers_want_the_form_the_content_grader_forgives() -> None:
    assert not devset.is_correct(ONE_WORD, "The capital of Japan is Tokyo.")
    assert not devset.is_correct(ONLY_NUMBER, "A bicycle has 2 wheels.")
    assert not devset.is_correct(ONE_WORD_LABEL, "A carrot is a vegetable.")
    assert not devset.is_correct(CITY_JSON, "In Madrid it is 21 degrees today.")


def test_relax_takes_the_form_out_of_a_pattern_and_keeps_prose_forms() -> None:
    assert relax("^\\W*\\w+\\W*$") is None  # one word: form only
    assert relax("^[\\s\\S]{1,280}$") is None  # a length: form only
    assert relax("[.!?]\\s*$") == "[.!?]\\s*$"  # how the answer ends: kept
    assert relax(PROSE_TOO["pattern"]) == PROSE_TOO["pattern"]
    assert relax("^\\W*tokyo\\W*$") == "(?<!\\w)(?:tokyo)(?!\\w)"
    assert relax("costs 5\\$") == "costs 5\\$"  # an escaped dollar is no anchor
    assert form_only(AT_MOST_5_WORDS) and not form_only(ONE_WORD_LABEL)


def test_every_strictly_right_cached_answer_is_right_in_content_too() -> None:
    answers = load_answers()
    strict = content = 0
    for prompt in devset.load():
        text = devset.answer_text(answers[prompt.id])
        right = devset.is_correct(prompt.check, text)
        strict += right
        content += is_content_correct(prompt.check, text)
        assert not right or is_content_correct(prompt.check, text), prompt.id
    assert content > strict
