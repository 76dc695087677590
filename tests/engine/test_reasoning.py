"""A model that thinks before it answers, on the engine's paths (``proxy/engine/reasoning.py``).

The model is the bundled SmolLM2 with a Qwen3-style template whose generation prompt opens a
``<think>`` block (``tests/thinking_model.py``), written into a temporary folder. Where a test
needs the block closed at a known place, a grammar makes the model write a few words, then
``</think>``, then an answer sentence; everything else is what the model writes by itself. The
single path (``LocalModel.chat``), the batch (``BatchEngine``) and the worker process
(``LocalEngine``, its pipe included) are each driven, streaming included.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine import tasks
from proxy.engine.batch.decode import BatchEngine
from proxy.engine.gate import Gate
from proxy.engine.generate import LocalModel
from proxy.engine.local_engine import LocalEngine
from proxy.engine.reasoning import ReasoningText, Splitter, ThinkFormat, split
from tests.thinking_model import thinking_gguf

# A few words of thinking, the closing tag, then a one-sentence answer.
FORMAT_GRAMMAR = 'root ::= [a-z ]{3,30} "</think>" "\\n\\n" [A-Z] [a-z ]{2,30} "."'
QUESTION = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 48}


@pytest.fixture(scope="module")
def thinking_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return thinking_gguf(tmp_path_factory.mktemp("thinking"))


@pytest.fixture(scope="module")
def thinker(thinking_path: Path) -> Iterator[LocalModel]:
    loaded = LocalModel.load(str(thinking_path), n_ctx=2048, n_threads=1, calibrate=False)
    yield loaded
    loaded.close()


def _grammar() -> Any:
    from llama_cpp.llama_grammar import LlamaGrammar

    return LlamaGrammar.from_string(FORMAT_GRAMMAR)


def _pieces(streamed: list[str]) -> tuple[str, str, list[bool]]:
    """The streamed thinking, the streamed answer, and which pieces were thinking, in order."""
    thinking = "".join(p for p in streamed if isinstance(p, ReasoningText))
    answer = "".join(p for p in streamed if not isinstance(p, ReasoningText))
    return thinking, answer, [isinstance(p, ReasoningText) for p in streamed]


def test_the_thinking_format_is_read_from_the_template(
    thinker: LocalModel, model: LocalModel
) -> None:
    assert thinker.thinking is not None
    assert (thinker.thinking.open_tag, thinker.thinking.close_tag) == ("<think>", "</think>")
    assert thinker.thinking.switch  # the template reads enable_thinking
    assert not thinker.thinking.special_tokens  # SmolLM2's vocabulary has no such special tokens
    assert model.thinking is None  # the bundled template does not think


def test_the_thinking_is_reasoning_content_and_the_answer_alone_is_content(
    thinker: LocalModel,
) -> None:
    thinker.forget()
    streamed: list[str] = []
    completion = thinker.chat(QUESTION, on_token=streamed.append, grammar=_grammar())
    message = completion["choices"][0]["message"]
    print(message)
    thinking, answer = message["reasoning_content"], message["content"]
    assert thinking and answer
    assert "</think>" not in thinking + answer and "<think>" not in thinking + answer
    assert answer[0].isupper() and answer.endswith(".")  # the grammar's answer sentence, whole
    # Streamed: every piece of thinking first, then the answer, each whole.
    said_thinking, said_answer, kinds = _pieces(streamed)
    assert (said_thinking, said_answer) == (thinking, answer)
    assert kinds == sorted(kinds, reverse=True)
    # The reasoning tokens are those up to and including the closing tag; the logprobs are
    # the answer's alone.
    usage = completion["usage"]
    reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
    entries = completion["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == answer
    assert 0 < reasoning_tokens < usage["completion_tokens"]
    assert reasoning_tokens + len(entries) <= usage["completion_tokens"]
    assert completion["frugal"]["thinking"]["finished"] is True
    verdict = completion["frugal"].get("quality") or Gate().score(QUESTION, completion)
    assert verdict["value"] is not None


def test_an_answer_cut_while_thinking_is_never_accepted(thinker: LocalModel) -> None:
    thinker.forget()
    request = {**QUESTION, "max_tokens": 3}
    streamed: list[str] = []
    completion = thinker.chat(request, on_token=streamed.append)
    message = completion["choices"][0]["message"]
    print(message, completion["usage"])
    assert message["content"] == ""
    assert message["reasoning_content"]
    assert completion["frugal"]["stop_cause"] == "max_tokens"
    assert completion["frugal"]["thinking"]["finished"] is False
    assert completion["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    assert all(isinstance(p, ReasoningText) for p in streamed) and streamed
    verdict = Gate().score(request, completion)
    assert verdict == {"value": None, "reasons": ["thinking_unfinished"], "signals": {}}


def test_thinking_stops_at_its_efforts_share_of_the_budget(thinker: LocalModel) -> None:
    thinker.forget()
    kept = thinker.thinking_budget
    thinker.thinking_budget = 12
    try:
        low = thinker.chat({**QUESTION, "reasoning_effort": "low", "max_tokens": 200})
        high = thinker.chat({**QUESTION, "reasoning_effort": "high", "max_tokens": 200})
    finally:
        thinker.thinking_budget = kept
    for completion, budget in ((low, 3), (high, 12)):
        print(completion["choices"][0]["message"], completion["frugal"]["stop_cause"])
        if completion["frugal"]["stop_cause"] == "thinking_budget":
            assert completion["usage"]["completion_tokens"] == budget
            assert completion["choices"][0]["finish_reason"] == "length"
            assert completion["frugal"]["thinking"] == {
                "finished": False,
                "reasoning_tokens": budget,
                "budget": budget,
            }
    # SmolLM2 does not close the block by itself within 3 tokens.
    assert low["frugal"]["stop_cause"] == "thinking_budget"


def test_effort_none_turns_thinking_off_where_the_template_allows(thinker: LocalModel) -> None:
    thinker.forget()
    request = {**QUESTION, "reasoning_effort": "none"}
    prompt = thinker.llm.detokenize(thinker.prompt_tokens(request)).decode()
    assert prompt.endswith("<think>\n\n</think>\n\n")
    completion = thinker.chat(request)
    message = completion["choices"][0]["message"]
    print(message)
    assert "reasoning_content" not in message
    assert message["content"]
    assert completion["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    opened = thinker.llm.detokenize(thinker.prompt_tokens(QUESTION)).decode()
    assert opened.endswith("<think>\n")


def test_the_batch_splits_the_answer_as_the_single_path_does(thinker: LocalModel) -> None:
    thinker.forget()
    single = thinker.chat(QUESTION, grammar=_grammar())
    batch = BatchEngine(thinker, 2)
    try:
        streamed: list[str] = []
        seq = batch.add(QUESTION, on_token=streamed.append, grammar=_grammar())
        cut = batch.add({**QUESTION, "max_tokens": 4})
        assert seq is not None and cut is not None
        batch.run_all()
        together = batch.completion(seq)
        unfinished = batch.completion(cut)
    finally:
        batch.close()
    assert together["choices"][0]["message"] == single["choices"][0]["message"]
    assert (
        together["usage"]["completion_tokens_details"]
        == (single["usage"]["completion_tokens_details"])
    )
    thinking, answer, kinds = _pieces(streamed)
    message = together["choices"][0]["message"]
    assert (thinking, answer) == (message["reasoning_content"], message["content"])
    assert kinds == sorted(kinds, reverse=True)
    assert unfinished["frugal"]["thinking"]["finished"] is False
    assert unfinished["choices"][0]["message"]["content"] == ""


def test_several_answers_add_up_their_thinking_and_the_unscored_one_is_the_worst(
    thinker: LocalModel,
) -> None:
    thinker.forget()
    request = {**QUESTION, "n": 2, "max_tokens": 3, "seed": 7}
    completion = tasks.chat(thinker, request, tasks.Hooks(None, None, Gate().score))
    print([c["message"] for c in completion["choices"]])
    assert len(completion["choices"]) == 2
    assert all(c["message"]["reasoning_content"] for c in completion["choices"])
    assert completion["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    assert completion["frugal"]["quality"]["reasons"] == ["thinking_unfinished"]


def test_a_grammar_answer_is_written_with_thinking_off(thinker: LocalModel) -> None:
    thinker.forget()
    request = {**QUESTION, "response_format": {"type": "json_object"}, "max_tokens": 24}
    prompt = thinker.llm.detokenize(thinker.prompt_tokens(request)).decode()
    assert prompt.endswith("<think>\n\n</think>\n\n")
    completion = tasks.chat(thinker, request, tasks.Hooks(None, None, Gate().score))
    message = completion["choices"][0]["message"]
    print(message)
    assert "reasoning_content" not in message
    assert message["content"].startswith("{")
    assert completion["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.parametrize(
    ("text", "opened"),
    [
        ("\nI add them.\n</think>\n\nFour.", True),
        ("  <think>sums  \n</think>Four. </thi", False),
        ("Four < five, and <b>", False),
        ("still < thinking </", True),
        (" <thi", False),
    ],
)
def test_a_streamed_answer_splits_as_the_whole_text_does(text: str, opened: bool) -> None:
    fmt = ThinkFormat()
    thinking, answer, _ = split(text, fmt, opened)
    for size in (1, 2, 3, 5):
        streamed: list[str] = []
        splitter = Splitter(fmt, opened, streamed.append)
        for start in range(0, len(text), size):
            splitter.feed(text[start : start + size])
        splitter.close()
        said_thinking, said_answer, kinds = _pieces(streamed)
        assert (said_thinking or None, said_answer) == (thinking or None, answer), size
        assert kinds == sorted(kinds, reverse=True)


def test_split_reads_an_answer_that_opens_its_own_block() -> None:
    fmt = ThinkFormat()
    assert split("<think>\nsums</think>\n\nFour.", fmt, opened=False) == ("sums", "Four.", True)
    assert split("Four.", fmt, opened=False) == (None, "Four.", True)
    assert split("sums and", fmt, opened=True) == ("sums and", "", False)


@pytest.mark.parametrize("parallel", [1, 2])
async def test_the_worker_streams_thinking_as_reasoning_pieces(
    thinking_path: Path, parallel: int
) -> None:
    engine = LocalEngine(
        LocalSettings(model_path=str(thinking_path), n_threads=1, parallel=parallel)
    )
    await engine.start()
    try:
        assert engine.info["thinking"]["switch"] is True
        assert engine.health()["thinking"] == {
            "open_tag": "<think>",
            "close_tag": "</think>",
            "switch": True,
            "special_tokens": False,
        }
        streamed: list[str] = []
        request = {**QUESTION, "max_tokens": 6}
        deadline = time.monotonic() + 120.0
        completion = await engine.chat(request, deadline=deadline, on_token=streamed.append)
    finally:
        await engine.stop()
    message = completion["choices"][0]["message"]
    print(message, completion["frugal"]["quality"])
    assert streamed and all(isinstance(p, ReasoningText) for p in streamed)
    assert "".join(streamed) == message["reasoning_content"]
    assert message["content"] == ""
    assert completion["frugal"]["quality"] == {
        "value": None,
        "reasons": ["thinking_unfinished"],
        "signals": {},
    }
