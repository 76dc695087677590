"""The dev set, its checkers, the cached answers and the metrics the evaluation prints."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from quality.dev import devset
from quality.dev.devset import check_number, check_python_function, is_correct
from quality.dev.local_answers import ANSWERS_PATH, grade, load_answers
from quality.dev.roc import at_threshold, roc_auc, threshold_for_precision

KINDS = {
    "factual",
    "arithmetic",
    "extraction",
    "classification",
    "format",
    "translation",
    "reasoning",
    "code",
    "summarisation",
    "writing",
}


@pytest.fixture(scope="module")
def prompts() -> list[devset.Prompt]:
    return devset.load()


def test_the_dev_set_has_200_prompts_over_every_kind_with_unique_ids(
    prompts: list[devset.Prompt],
) -> None:
    assert len(prompts) >= 200
    assert {p.kind for p in prompts} == KINDS
    assert len({p.id for p in prompts}) == len(prompts)


def test_the_heldout_split_is_a_third_of_every_kind(prompts: list[devset.Prompt]) -> None:
    total = Counter(p.kind for p in prompts)
    held = Counter(p.kind for p in prompts if p.split == "heldout")
    assert {p.split for p in prompts} == {"train", "heldout"}
    for kind in KINDS:
        assert 0.28 <= held[kind] / total[kind] <= 0.42, kind


def test_every_request_is_an_openai_chat_body_with_a_token_limit(
    prompts: list[devset.Prompt],
) -> None:
    for p in prompts:
        assert p.request["messages"][-1]["role"] == "user"
        assert isinstance(p.request["max_tokens"], int) and p.request["max_tokens"] <= 160


def test_every_checker_runs_and_rejects_an_empty_answer(prompts: list[devset.Prompt]) -> None:
    for p in prompts:
        assert is_correct(p.check, "") is False, p.id


def test_cached_answers_cover_the_dev_set_and_grade(prompts: list[devset.Prompt]) -> None:
    answers = load_answers(ANSWERS_PATH)
    assert {p.id for p in prompts} <= set(answers)
    graded = grade(prompts, answers)
    right = sum(g.correct for g in graded)
    assert 0 < right < len(graded)
    for g in graded:
        assert g.completion["choices"][0]["logprobs"]["content"], g.prompt.id


# --- checkers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "right", "wrong"),
    [
        ({"type": "regex", "pattern": r"\bcanberra\b"}, "It is Canberra.", "It is Sydney."),
        ({"type": "number", "value": 42}, "17 + 25 = 42", "17 + 25 = 32"),
        ({"type": "number", "value": 42, "mode": "only"}, "42.", "The answer is 42."),
        ({"type": "number", "value": 1023}, "The sum is 1,023.", "The sum is 1,032."),
        (
            {"type": "label", "answer": "health", "labels": ["sports", "health"]},
            "Health, not sports.",
            "Sports, not health.",
        ),
        (
            {"type": "last_of", "answer": "sue", "options": ["tom", "jim", "sue"]},
            "Tom > Jim > Sue, so Sue.",
            "Sue is tall, so the shortest is Jim.",
        ),
        ({"type": "contains_all", "terms": ["flour", "egg"]}, "flour, eggs", "flour, sugar"),
        (
            {"type": "json", "values": {"city": "Turin"}},
            '{"city": "turin"}',
            '```json\n{"city": "Turin"}\n```',
        ),
        (
            {"type": "json", "fenced_ok": True, "values": {"city": "Turin"}},
            '```json\n{"city": "Turin"}\n```',
            '{"city": "Milan"}',
        ),
        ({"type": "list_items", "min": 2, "max": 3}, "- a\n- b", "a, b"),
        ({"type": "word_count", "min": 3, "max": 3}, "It is blue.", "Blue."),
        (
            {
                "type": "extract",
                "source": "The bridge was completed in 1932.",
                "check": {"type": "regex", "pattern": "1932"},
            },
            "1932",
            "The bridge was completed in 1932.",
        ),
        ({"type": "not", "check": {"type": "regex", "pattern": "je suis"}}, "Bonjour", "Je suis"),
    ],
)
def test_checkers_tell_right_from_wrong(check: dict[str, Any], right: str, wrong: str) -> None:
    assert is_correct(check, right)
    assert not is_correct(check, wrong)


def test_writing_checker_wants_length_topic_language_and_no_loop() -> None:
    check = {
        "type": "writing",
        "keywords": ["sea", "wave", "shore"],
        "min_keywords": 2,
        "min_words": 8,
        "max_words": 60,
        "language": "en",
        "max_repeat": 0.4,
    }
    good = "The sea rolls in, wave after wave, and the shore keeps every shell it is given."
    assert is_correct(check, good)
    assert not is_correct(check, "The sea.")
    assert not is_correct(check, "A quiet field of wheat under a warm and patient summer sky.")
    assert not is_correct(
        check, "La mer est calme et les vagues arrivent sur la plage du sea wave."
    )
    assert not is_correct(check, "the sea and the wave and the shore " * 6)


def test_a_summary_that_copies_the_passage_is_not_a_summary() -> None:
    passage = "The council voted to close the old pool because repairs would cost too much money."
    check = {
        "type": "writing",
        "keywords": ["pool", "close"],
        "min_keywords": 2,
        "min_words": 3,
        "max_words": 60,
        "not_a_copy_of": passage,
    }
    assert is_correct(check, "The old pool will close: fixing it costs too much.")
    assert not is_correct(check, passage)


def test_python_function_checker_runs_the_code_in_a_separate_interpreter() -> None:
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    loops = "def add(a, b):\n    while True:\n        pass"
    cases = [[[2, 3], 5]]
    assert check_python_function(good, "add", cases)
    assert not check_python_function(bad, "add", cases)
    assert not check_python_function(loops, "add", cases, timeout=1.0)
    assert not check_python_function("import os\ndef add(a, b):\n    return a + b", "add", cases)


def test_number_checker_reads_words_and_the_first_line() -> None:
    assert check_number("There are seven continents.", 7)
    assert check_number("The answer is 0.75.\n\nIt is 0.5 + 0.25 which is 1", 0.75)
    assert not check_number("No number here.", 3)


# --- metrics ----------------------------------------------------------------------------------


def test_roc_auc_counts_pairs_and_ties() -> None:
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [True, True, False, False]) == 1.0
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert roc_auc([0.9, 0.3, 0.6, 0.1], [True, True, False, False]) == 0.75


def test_threshold_metrics() -> None:
    scores = [0.95, 0.9, 0.7, 0.65, 0.4, 0.2]
    labels = [True, True, False, True, True, False]
    r = at_threshold(scores, labels, 0.6)
    assert (r.accepted, r.precision, r.recall) == (4, 0.75, 0.75)
    best = threshold_for_precision(scores, labels, 0.9)
    assert best is not None and best.threshold == 0.9 and best.precision == 1.0
    assert threshold_for_precision([0.5], [False], 0.9) is None
