"""Each quality signal on hand-written, real-looking completions: one passing, one failing."""

from __future__ import annotations

import math
from typing import Any

import pytest

from quality import Score, check_schema, score, signals
from quality._view import view_of
from quality.confidence import confidence
from quality.degeneration import degeneration, is_engine_truncation, leaked_tokens, repeat_ratio
from quality.evasion import evasion
from quality.format import format_compliance
from quality.instructions import failed_instructions
from quality.language import detect, expected_language
from quality.task import kind_of
from quality.verify import evaluate, expected_result, false_equations, verify


def request(prompt: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": prompt},
        ],
    }
    body.update(extra)
    return body


def completion(
    content: str | None,
    *,
    logprobs: list[tuple[str, float]] | None = None,
    finish_reason: str = "stop",
    stop_cause: str | None = None,
    completion_tokens: int | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason}
    choice["logprobs"] = (
        None
        if logprobs is None
        else {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in logprobs
            ]
        }
    )
    n = completion_tokens if completion_tokens is not None else len(logprobs or []) or 5
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "smollm2-135m-instruct",
        "choices": [choice],
        "usage": {"prompt_tokens": 31, "completion_tokens": n, "total_tokens": 31 + n},
    }
    if stop_cause is not None:
        body["frugal"] = {"stop_cause": stop_cause}
    return body


def sure(text: str, logprob: float = -0.05) -> list[tuple[str, float]]:
    """Word-ish tokens of ``text``, each chosen with the same logprob."""
    words = text.split(" ")
    return [(w if i == 0 else " " + w, logprob) for i, w in enumerate(words)]


PARIS_Q = "What is the capital of France?"
PARIS_A = "The capital of France is Paris."


# --- the public contract ----------------------------------------------------------------------


def test_score_is_a_frozen_value_in_unit_interval_with_reasons_and_signals() -> None:
    s = score(request(PARIS_Q), completion(PARIS_A, logprobs=sure(PARIS_A)))
    assert isinstance(s, Score)
    assert 0.0 <= s.value <= 1.0
    assert s.reasons == []
    assert "confidence" in s.signals and "degeneration" in s.signals
    with pytest.raises(AttributeError):
        s.value = 0.0  # type: ignore[misc]


def test_without_logprobs_confidence_is_not_used_but_the_answer_is_still_scored() -> None:
    s = score(request(PARIS_Q), completion(PARIS_A, logprobs=None))
    assert "confidence" not in s.signals
    assert "degeneration" in s.signals
    assert 0.0 < s.value < 1.0


# --- degeneration -----------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "   \n\t ", None])
def test_empty_output_is_a_hard_failure(content: str | None) -> None:
    s = score(request(PARIS_Q), completion(content, logprobs=[("\n", -0.1)]))
    assert s.reasons[0] == "empty"
    assert s.value < 0.2


def test_a_tool_call_with_no_text_is_not_empty() -> None:
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    s = score(
        request("What time is it?", tools=tools),
        completion(None, tool_calls=[call], finish_reason="tool_calls"),
    )
    assert "empty" not in s.reasons


@pytest.mark.parametrize(
    "tail",
    [
        "<|im_end|>",
        "<|im_start|>assistant",
        "[/INST]",
        "<end_of_turn>",
        "<start_of_turn>model",
        "<|eot_id|>",
        "<|endoftext|>",
        "</s>",
    ],
)
def test_leaked_template_tokens_are_a_hard_failure(tail: str) -> None:
    text = f"{PARIS_A}{tail}"
    s = score(request(PARIS_Q), completion(text, logprobs=sure(text)))
    assert "template_leak" in s.reasons
    assert s.value < 0.2


def test_html_strikethrough_is_not_a_template_leak() -> None:
    assert leaked_tokens("Use <s>old price</s> to strike text in HTML.") == []
    assert leaked_tokens("Paris</s>") == ["</s>"]


def test_engine_truncation_counts_but_the_clients_own_max_tokens_does_not() -> None:
    text = "The French Revolution began in 1789 and reshaped"
    req = request("Tell me about the French Revolution.", max_tokens=10)

    def cut(stop_cause: str, completion_tokens: int) -> Any:
        return completion(
            text,
            logprobs=sure(text),
            finish_reason="length",
            stop_cause=stop_cause,
            completion_tokens=completion_tokens,
        )

    client_cut, engine_cut, full_ctx = (
        cut("max_tokens", 10),
        cut("deadline", 8),
        cut("context_full", 8),
    )
    assert "truncated" not in score(req, client_cut).reasons
    assert score(req, engine_cut).reasons[0] == "truncated"
    assert score(req, full_ctx).value < 0.2


def test_an_answer_the_clients_limit_cut_mid_sentence_is_flagged_soft() -> None:
    req = request("Write a thank-you note to a friend.", max_tokens=12)
    mid = "Dear Sam, thank you so much for helping me move the boxes and"
    done = "Dear Sam, thank you so much for all your help with the move!"
    at_limit = {"finish_reason": "length", "stop_cause": "max_tokens", "completion_tokens": 12}
    cut = degeneration(view_of(req, completion(mid, **at_limit)))
    ended = degeneration(view_of(req, completion(done, **at_limit)))
    short = degeneration(view_of(req, completion(mid, finish_reason="stop")))
    assert cut.features["cut_mid"] == 1.0 and cut.soft == {"cut_off": "cut_mid"}
    assert cut.hard == ()
    assert ended.features["cut_mid"] == 0.0
    assert short.features["cut_mid"] == 0.0


def test_a_count_of_sentences_inside_an_upper_bound_is_checked_once() -> None:
    failed, checked = failed_instructions("Summarise it in two sentences.", "It rained.")
    assert (failed, checked) == ([], 1)


def test_without_stop_cause_length_at_the_clients_limit_is_the_clients_cut() -> None:
    text = "Photosynthesis turns light, water and carbon dioxide into sugar and"
    at_limit = completion(text, finish_reason="length", completion_tokens=12)
    below_limit = completion(text, finish_reason="length", completion_tokens=7)
    req = request("Explain photosynthesis.", max_tokens=12)
    assert not is_engine_truncation(view_of(req, at_limit))
    assert is_engine_truncation(view_of(req, below_limit))
    assert is_engine_truncation(view_of(request("Explain photosynthesis."), at_limit))


def test_max_completion_tokens_is_read_like_max_tokens() -> None:
    text = "Photosynthesis turns light into"
    req = request("Explain photosynthesis.", max_completion_tokens=5)
    cut = completion(text, finish_reason="length", stop_cause="max_tokens", completion_tokens=5)
    assert not is_engine_truncation(view_of(req, cut))


def test_a_looping_answer_is_flagged_as_repetition() -> None:
    loop = "The answer is 42. " * 12
    s = score(request("What is six times seven?"), completion(loop, logprobs=sure(loop, -0.2)))
    assert "repetition" in s.reasons
    assert s.value < 0.6
    assert repeat_ratio(loop) > 0.75


def test_a_list_of_similar_items_is_not_a_loop() -> None:
    text = (
        "1. Paris is the capital of France.\n2. Berlin is the capital of Germany.\n"
        "3. Madrid is the capital of Spain.\n4. Rome is the capital of Italy."
    )
    assert repeat_ratio(text) < 0.75
    assert (
        "repetition"
        not in degeneration(view_of(request("List four capitals."), completion(text))).hard
    )


def test_an_answer_in_another_language_than_the_question_is_flagged() -> None:
    q = "Why is the sky blue during the day?"
    french = (
        "Le ciel est bleu parce que la lumière du soleil est diffusée par les molécules de l'air."
    )
    english = "The sky is blue because sunlight is scattered by the molecules in the air."
    assert "wrong_language" in score(request(q), completion(french, logprobs=sure(french))).reasons
    assert (
        "wrong_language"
        not in score(request(q), completion(english, logprobs=sure(english))).reasons
    )


def test_translation_expects_the_target_language() -> None:
    q = "Translate into French: The cat is sleeping on the sofa and the dog is in the garden."
    assert expected_language(q, q) == "fr"
    good = "Le chat dort sur le canapé et le chien est dans le jardin."
    bad = "The cat is sleeping on the sofa and the dog is in the garden."
    assert degeneration(view_of(request(q), completion(good))).features["wrong_language"] == 0.0
    assert degeneration(view_of(request(q), completion(bad))).features["wrong_language"] == 1.0


def test_language_detection_abstains_on_thin_evidence() -> None:
    assert detect("Paris") is None
    assert detect("42") is None
    assert detect("Привет, как дела у тебя сегодня?") == "ru"
    assert detect("Der Hund schläft und die Katze ist nicht im Haus.") == "de"


# --- confidence -------------------------------------------------------------------------------


def test_confidence_features_read_the_logprobs() -> None:
    lps = [("The", -0.1), (" capital", -0.2), (" is", -0.1), (" Canberra", -3.5), (".", -0.05)]
    sig = confidence(view_of(request("Capital of Australia?"), completion("x", logprobs=lps)))
    assert sig.applied
    assert sig.features["conf_mean"] == pytest.approx((-0.1 - 0.2 - 0.1 - 3.5 - 0.05) / 5)
    assert sig.features["conf_low_share"] == pytest.approx(1 / 5)
    assert sig.features["conf_head"] == pytest.approx(sig.features["conf_mean"])  # < 16 tokens
    assert sig.features["conf_head_min"] == pytest.approx(-3.5)
    # "Canberra" is the only content word not already in the prompt
    assert sig.features["conf_novel_min"] == pytest.approx(-3.5)


def test_worst_window_finds_the_one_confused_stretch() -> None:
    lps = [(" a", -0.05)] * 20 + [(" b", -4.0)] * 8 + [(" c", -0.05)] * 20
    sig = confidence(view_of(request("q"), completion("x", logprobs=lps)))
    assert sig.features["conf_worst_window"] == pytest.approx(-4.0)
    assert sig.features["conf_mean"] > -1.0


def test_minus_infinity_logprobs_are_clipped() -> None:
    sig = confidence(
        view_of(request("q"), completion("x", logprobs=[("a", -math.inf), ("b", -0.1)]))
    )
    assert math.isfinite(sig.features["conf_mean"])


def test_low_confidence_is_reported_only_for_an_unsure_answer() -> None:
    text = "The capital of Australia is Sydney, which was founded in 1788 by settlers."
    req = request("What is the capital of Australia?")
    assert "low_confidence" in score(req, completion(text, logprobs=sure(text, -2.3))).reasons
    assert "low_confidence" not in score(req, completion(text, logprobs=sure(text, -0.05))).reasons


def test_no_logprobs_means_confidence_does_not_apply() -> None:
    assert not confidence(view_of(request("q"), completion("Paris."))).applied


# --- evasion ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I cannot help with that request.",
        "As an AI language model, I do not have personal opinions about capitals.",
        "I cannot provide that information.",
        "Unfortunately, I don't have access to real-time data.",
    ],
)
def test_refusals_are_flagged(text: str) -> None:
    s = score(
        request("What is the boiling point of water at sea level in Celsius?"),
        completion(text, logprobs=sure(text)),
    )
    assert "refusal" in s.reasons
    assert evasion(view_of(request("q"), completion(text))).features["refusal"] == 1.0


def test_an_answer_that_mentions_cannot_late_is_not_a_refusal() -> None:
    text = (
        "Water boils at 100 degrees Celsius at sea level. At altitude it boils lower, "
        "because the air pressure is lower and molecules escape more easily; you cannot "
        "cook pasta as fast there."
    )
    assert evasion(view_of(request("q"), completion(text))).features["refusal"] == 0.0


def test_restating_the_question_is_flagged() -> None:
    q = "What is the main cause of the seasons on Earth?"
    echo = "The main cause of the seasons on Earth is the main cause of the seasons."
    real = "The tilt of Earth's axis, about 23.5 degrees, changes how directly sunlight hits us."
    assert "restates_question" in evasion(view_of(request(q), completion(echo))).soft
    assert "restates_question" not in evasion(view_of(request(q), completion(real))).soft


def test_a_label_taken_from_the_question_is_not_a_restatement() -> None:
    q = "Classify the sentiment as positive, negative or neutral: I loved this film."
    assert evasion(view_of(request(q), completion("Positive"))).features["restate_ratio"] == 0.0


def test_an_answer_that_repeats_the_quoted_passage_is_flagged() -> None:
    q = "Which day of the week is mentioned: 'The shop is closed on Wednesday afternoons.'"
    echo = evasion(view_of(request(q), completion("The shop is closed on Wednesday afternoons.")))
    picked = evasion(view_of(request(q), completion("Wednesday.")))
    assert echo.features["quote_copy"] == 1.0
    assert "echoes_quote" in echo.soft
    assert picked.features["quote_copy"] == 0.0
    assert "echoes_quote" not in picked.soft


def test_a_passage_after_a_colon_counts_as_quoted_but_short_quotes_do_not() -> None:
    passage = "The council voted to close the old pool and build a new leisure centre by 2027."
    q = f"Summarise in one sentence:\n\n{passage}"
    assert evasion(view_of(request(q), completion(passage))).features["quote_copy"] == 1.0
    short = "Translate 'good morning' into French."
    assert evasion(view_of(request(short), completion("good morning"))).features["quote_copy"] == 0


# --- format: response_format and tools --------------------------------------------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def json_schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def test_json_object_mode_needs_parseable_json_object() -> None:
    req = request(
        "Give me a JSON object with the name and age of Ada Lovelace.",
        response_format={"type": "json_object"},
    )
    good = '{"name": "Ada Lovelace", "age": 36}'
    fenced = '```json\n{"name": "Ada Lovelace", "age": 36}\n```'
    prose = "Ada Lovelace died at the age of 36."
    assert "json_invalid" not in score(req, completion(good, logprobs=sure(good))).reasons
    for bad in (fenced, prose, "[1, 2]"):
        s = score(req, completion(bad, logprobs=sure(bad)))
        assert s.reasons[0] == "json_invalid"
        assert s.value < 0.2


def test_json_schema_mode_validates_against_the_schema() -> None:
    req = request(
        "Name and age of Ada Lovelace as JSON.", response_format=json_schema_format(PERSON_SCHEMA)
    )
    ok = '{"name": "Ada Lovelace", "age": 36}'
    wrong_type = '{"name": "Ada Lovelace", "age": "thirty-six"}'
    extra = '{"name": "Ada Lovelace", "age": 36, "born": 1815}'
    assert format_compliance(view_of(req, completion(ok))).hard == ()
    assert format_compliance(view_of(req, completion(wrong_type))).hard == ("schema_mismatch",)
    assert format_compliance(view_of(req, completion(extra))).hard == ("schema_mismatch",)


def test_a_malformed_schema_does_not_crash_the_scorer_and_check_schema_reports_it() -> None:
    bad_schema = {"type": "object", "properties": {"age": {"type": "integr"}}}
    req = request("JSON please.", response_format=json_schema_format(bad_schema))
    s = score(req, completion('{"age": 3}', logprobs=sure('{"age": 3}')))
    assert "schema_mismatch" not in s.reasons
    assert check_schema(bad_schema) is not None
    assert check_schema(["not", "a", "schema"]) is not None
    assert check_schema(PERSON_SCHEMA) is None
    assert check_schema(True) is None


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("get_weather", '{"city": "Lyon", "unit": "c"}', ()),
        ("get_wether", '{"city": "Lyon"}', ("tool_unknown",)),
        ("get_weather", '{"city": "Lyon"', ("tool_args_invalid",)),
        ("get_weather", '{"unit": "k"}', ("tool_args_mismatch",)),
    ],
)
def test_tool_calls_must_name_a_tool_and_fit_its_parameters(
    name: str, arguments: str, expected: tuple[str, ...]
) -> None:
    req = request("What's the weather in Lyon?", tools=TOOLS)
    comp = completion(None, tool_calls=[call(name, arguments)], finish_reason="tool_calls")
    assert format_compliance(view_of(req, comp)).hard == expected
    if expected:
        assert score(req, comp).value < 0.2


def test_required_tool_choice_without_a_call_fails() -> None:
    req = request("What's the weather in Lyon?", tools=TOOLS, tool_choice="required")
    assert format_compliance(view_of(req, completion("It is sunny."))).hard == ("tool_missing",)


def test_several_calls_are_each_checked_against_their_tools_schema() -> None:
    req = request("What's the weather in Lyon and in Nice?", tools=TOOLS)
    good = [call("get_weather", '{"city": "Lyon"}'), call("get_weather", '{"city": "Nice"}')]
    bad = [good[0], call("get_weather", '{"unit": "k"}')]
    valid = completion(None, tool_calls=good, finish_reason="tool_calls")
    assert format_compliance(view_of(req, valid)).hard == ()
    broken = completion(None, tool_calls=bad, finish_reason="tool_calls")
    assert format_compliance(view_of(req, broken)).hard == ("tool_args_mismatch",)
    assert score(req, broken).value < 0.2


def test_several_calls_break_parallel_tool_calls_false() -> None:
    req = request("What's the weather in Lyon and in Nice?", tools=TOOLS, parallel_tool_calls=False)
    two = [call("get_weather", '{"city": "Lyon"}'), call("get_weather", '{"city": "Nice"}')]
    comp = completion(None, tool_calls=two, finish_reason="tool_calls")
    assert format_compliance(view_of(req, comp)).hard == ("tool_parallel",)
    one = completion(None, tool_calls=two[:1], finish_reason="tool_calls")
    assert format_compliance(view_of(req, one)).hard == ()


# --- explicit instructions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "good", "bad", "name"),
    [
        (
            "What colour is a ripe banana? Answer with one word.",
            "Yellow.",
            "It is yellow.",
            "one_word",
        ),
        ("What is 17 + 25? Reply with just the number.", "42", "17 + 25 = 42", "number"),
        ("Is Paris in France? Answer yes or no.", "Yes, it is.", "Paris is in France.", "yes_no"),
        (
            "List three primary colours, comma separated.",
            "red, blue, yellow",
            "red\nblue\nyellow",
            "comma_separated",
        ),
        (
            "Describe the moon in at most 5 words.",
            "Cold grey rock in space.",
            "The moon is a cold grey rock that orbits Earth.",
            "max_words",
        ),
        (
            "Explain gravity in one sentence.",
            "Gravity pulls masses toward each other.",
            "Gravity pulls masses together. It keeps us on Earth.",
            "sentences",
        ),
        (
            "Write two sentences encouraging people to recycle.",
            "Recycling saves resources. Sort your bins today!",
            "By recycling we all reduce waste and help the planet.",
            "sentence_count",
        ),
        (
            "Write a three-sentence story about a lost key.",
            "Mia lost her key. She searched all day. It was in her pocket.",
            "Mia lost her key. It was in her pocket.",
            "sentence_count",
        ),
        (
            "Classify the sentiment as positive, negative or neutral: The food was cold.",
            "Negative",
            "The review is not good.",
            "label",
        ),
        (
            "Return the answer as JSON with a key 'city'.",
            '{"city": "Paris"}',
            "The city is Paris.",
            "json",
        ),
        (
            "Give me three fruits as a bullet list.",
            "- apple\n- pear\n- plum",
            "apple, pear, plum",
            "list",
        ),
        ("Write the word hello in all caps.", "HELLO", "Hello", "uppercase"),
        (
            "Write the first three letters of the alphabet in lowercase.",
            "a b c",
            "A B C",
            "lowercase",
        ),
        (
            "Reply in exactly three words: what colour is snow?",
            "It is white.",
            "Snow is usually white.",
            "exact_words",
        ),
        (
            "Give the answer as a single number: how many wheels does a car have?",
            "4",
            "A car has 4 wheels.",
            "number",
        ),
        (
            "Is a whale a mammal or a fish?",
            "Whales are mammals, not fish.",
            "Whales live in the ocean and can be very large animals.",
            "label",
        ),
        ("True or false: the Sun is a star.", "True.", "The Sun is very hot.", "label"),
        (
            "What is the chemical symbol for oxygen? Answer with the symbol only.",
            "O",
            "The chemical symbol for oxygen is O.",
            "short",
        ),
        (
            "Where was she born? Reply with just the city.",
            "Lagos.",
            "She was born in the city of Lagos, in the south-west of Nigeria.",
            "short",
        ),
        (
            "Give me three tips for sleeping well.",
            "1. Keep a schedule.\n2. Avoid screens.\n3. Cut caffeine.",
            "1. Keep a schedule.\n2. Avoid screens.\n3. Cut caffeine.\n4. Exercise.",
            "count",
        ),
        (
            "Write a short poem about friendship that includes the word 'lantern'.",
            "A friend is a lantern in the dark.",
            "A friend is a light in the dark.",
            "include_word",
        ),
        (
            "Write a quote about mistakes. Don't use the word 'failure'.",
            "Every mistake is a lesson in disguise.",
            "Failure is only the first step.",
            "avoid_word",
        ),
        (
            "Write a tweet (under 40 characters) about voting.",
            "Vote on Thursday!",
            "Please remember to go and vote on Thursday, every voice counts!",
            "max_chars",
        ),
        (
            "Write a haiku about coffee.",
            "Dark cup in my hands\nsteam rising over the page\nmorning finds its voice",
            "Coffee is a warm drink that many people enjoy in the morning.",
            "lines",
        ),
        (
            "Write a four-line poem about a city at night.",
            "Neon hums\nstreets exhale\ntrains sigh home\nthe city sleeps",
            "Neon hums\nstreets exhale",
            "lines",
        ),
    ],
)
def test_explicit_instructions_are_checked(prompt: str, good: str, bad: str, name: str) -> None:
    assert failed_instructions(prompt, good) == ([], 1)
    failed, checked = failed_instructions(prompt, bad)
    assert failed == [name] and checked == 1
    s = score(request(prompt), completion(bad, logprobs=sure(bad)))
    assert f"format:{name}" in s.reasons


def test_no_instruction_means_nothing_is_checked() -> None:
    assert failed_instructions("Tell me about the Eiffel Tower.", "It is in Paris.") == ([], 0)
    sigs = signals(request("Tell me about the Eiffel Tower."), completion("It is in Paris."))
    assert not next(s for s in sigs if s.name == "instructions").applied


# --- reasons ----------------------------------------------------------------------------------


def test_hard_reasons_come_before_soft_ones() -> None:
    text = "As an AI, I cannot say. <|im_end|>"
    s = score(request(PARIS_Q), completion(text, logprobs=sure(text, -2.0)))
    assert s.reasons[0] == "template_leak"
    assert "refusal" in s.reasons and "low_confidence" in s.reasons


# --- verification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 + 25", 42.0),
        ("90 minus 45 plus 10", 55.0),
        ("7 times 6 minus 2", 40.0),
        ("2 to the power of 10", 1024.0),
        ("144 divided by 12", 12.0),
        ("1,000 - 367", 633.0),
    ],
)
def test_arithmetic_is_evaluated_with_precedence(expression: str, value: float) -> None:
    assert evaluate(expression) == pytest.approx(value)


def test_division_by_zero_and_huge_powers_are_not_evaluated() -> None:
    assert evaluate("5 / 0") is None
    assert evaluate("2 ^ 100000") is None


def test_false_equations_in_the_answer_are_counted() -> None:
    assert false_equations("So 7 + 8 + 9 = 27, and 10 - 3 = 6.") == 2
    assert false_equations("3 * 60 = 180 minutes, and 2 × 6 = 12.") == 0


def test_a_plain_arithmetic_question_is_checked_against_the_final_number() -> None:
    q = "What is 144 divided by 12?"
    assert expected_result(q) == pytest.approx(12.0)
    assert expected_result("What is 15% of 200?") == pytest.approx(30.0)
    assert expected_result("What is the capital of France?") is None
    right = verify(view_of(request(q), completion("144 divided by 12 is 12.")))
    wrong = verify(view_of(request(q), completion("144 divided by 12 is 1.44.")))
    assert right.features["arith_mismatch"] == 0.0
    assert wrong.features["arith_mismatch"] == 1.0
    assert "wrong_result" in score(request(q), completion("144 divided by 12 is 1.44.")).reasons


def test_verification_does_not_apply_without_anything_to_check() -> None:
    sig = verify(view_of(request(PARIS_Q), completion(PARIS_A)))
    assert not sig.applied


# --- task kind --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [
        ("Translate into German: 'Good night'", "translate"),
        ("What is 23 multiplied by 4?", "math"),
        ("Write a Python function that reverses a list.", "code"),
        ("Classify the sentiment as positive or negative: 'Great film.'", "choice"),
        ("Summarise this paragraph in one sentence: The council met on Monday.", "summarise"),
        ("Write a short poem about the sea.", "write"),
        ("Who painted the Mona Lisa?", "other"),
    ],
)
def test_task_kind_is_read_from_the_request(prompt: str, kind: str) -> None:
    assert kind_of(view_of(request(prompt), completion("x"))) == kind


def test_a_json_response_format_makes_the_task_json() -> None:
    req = request("Who painted the Mona Lisa?", response_format={"type": "json_object"})
    assert kind_of(view_of(req, completion("{}"))) == "json"


# --- base-model symptoms ----------------------------------------------------------------------


def test_an_answer_that_opens_by_echoing_the_prompt_is_a_hard_failure() -> None:
    q = "What is the capital of Australia?"
    echo = "\nWhat is the capital of Australia? quân\nWhat is the capital of"
    s = score(request(q), completion(echo, logprobs=sure(echo, -1.0)))
    assert "prompt_echo" in s.reasons
    assert s.value < 0.2
    fine = "The capital of Australia is Canberra."
    assert "prompt_echo" not in score(request(q), completion(fine, logprobs=sure(fine))).reasons


def test_a_short_prompt_is_not_echo_checked() -> None:
    assert "prompt_echo" not in score(request("Say hello"), completion("Say hello to you!")).reasons


def test_a_role_name_left_by_a_detokenized_turn_marker_is_a_template_leak() -> None:
    assert leaked_tokens("Paris.\nрованиеuser\nWhat is") == ["role:user"]
    assert leaked_tokens("Paris.\nmodel\nSure") == ["role:model"]
    assert leaked_tokens("In this design the user model stores names.") == []


def test_a_number_of_items_is_only_counted_in_a_list_and_a_negated_word_is_not_required() -> None:
    prose = "Keep a schedule, avoid screens at night and cut caffeine after noon."
    assert failed_instructions("Give me three tips for sleeping well.", prose) == ([], 1)
    # "don't use the word X" is an avoid instruction, never an include one
    assert failed_instructions("Write a quote. Don't use the word 'failure'.", "Try again.") == (
        [],
        1,
    )
    # "just the translation" asks for no commentary, not for a short answer
    assert failed_instructions("Reply with just the translation.", "Je voudrais un café.") == (
        [],
        0,
    )


def test_a_short_run_of_one_emoji_is_a_loop() -> None:
    loop = "👏🏼" * 14
    assert repeat_ratio(loop) >= 0.75
    s = score(request("Write a tweet encouraging people to vote."), completion(loop))
    assert "repetition" in s.reasons
    assert s.value <= 0.1


def test_a_chain_longer_than_the_limit_is_not_checked_by_its_tail() -> None:
    thirty = " + ".join(["1"] * 30) + " = 30"
    assert false_equations(thirty) == 0
    assert false_equations("2 + 3 = 5 and 4 * 4 = 15") == 1
    loop = "1+" * 5000 + "1 = 5"  # no equation of 16 operations or fewer: nothing checked
    assert false_equations(loop) == 0


def test_an_equation_is_read_from_the_start_of_a_number_not_from_inside_one() -> None:
    # "12 / 10 = 2" is one false equation; "2 / 10 = 2", read from inside "12", is not another
    assert false_equations("Two fifths of 60 is 2 * 60 / 100 = 12 / 10 = 2.") == 1
    assert false_equations("1" * 5000) == 0


@pytest.mark.parametrize(
    "text",
    [
        "1" * 4000,
        "a, " * 1300,
        "1.5" * 1300,
        "1,000" * 800,
        "1 + " * 1000,
        "classify as " + "a, " * 1300,
        "'" + "ab " * 1300,
        "(" * 4000,
        "```python\n" * 400,
    ],
)
def test_long_degenerate_prompts_and_answers_get_a_score(text: str) -> None:
    for prompt, answer in ((text, "An answer."), ("What is this?", text), (text, text)):
        s = score(request(prompt), completion(answer, logprobs=sure(answer[:200])))
        assert 0.0 <= s.value <= 1.0
