"""What the engine worker does with one job, around :class:`LocalModel`'s token loop.

    chat      grammar (JSON mode, tools) -> the tool-aware prompt -> n answers -> scored
    complete  each prompt x n answers of a legacy text completion -> scored

An answer that may make several tool calls is watched as it grows: a small model may repeat
a call it has made instead of ending, so the answer ends at the first repeated call (stop cause
``repeated_call``), which :func:`proxy.engine.tools.to_message` then drops.

An answer of calls that makes again a call already answered in the conversation
(:func:`quality.turns.answered_calls`: same name, same arguments, a result that is not an error)
loses that call; when that leaves no call and the request lets the model answer in text
(``tool_choice`` ``"auto"``), the model is asked again for text (:func:`_text_instead`), so an
agent loop that has its result gets an answer from it rather than the same call until its step
limit. A call the client requires is left as it is, for the gate to judge.

Every answer is scored by the quality gate here, in the worker, so that its CPU stays off the
proxy's event loop. With several answers (``n`` > 1, or several prompts) the request's score is
the worst one's: the client gets all of them, so all of them must be good enough.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from proxy.engine import grammar as grammar_mod
from proxy.engine import legacy, tools
from proxy.engine.generate import LocalModel, StopCheck, TokenCallback
from quality.turns import answered_calls

Scorer = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
# Stop causes that end a job early: the remaining answers are not generated.
ABORTING = frozenset({"deadline", "cancelled"})


@dataclass(frozen=True)
class Hooks:
    """What the worker hands a task besides the request: where a streamed answer's text goes
    (``on_token``, None when not streamed), when to stop (``should_stop``), and the quality
    gate that scores each answer (``score``)."""

    on_token: TokenCallback | None
    should_stop: StopCheck | None
    score: Scorer


class BadGrammar(Exception):
    """llama.cpp refused the grammar text built for a request."""


@lru_cache(maxsize=64)
def _grammar(model: LocalModel, gbnf: str) -> Any:
    import llama_cpp
    from llama_cpp.llama_grammar import LlamaGrammar

    # llama.cpp returns NULL for a grammar it cannot parse, and a NULL sampler in the chain
    # would crash the worker: try it once on its own first.
    probe = llama_cpp.llama_sampler_init_grammar(
        model.llm._model.vocab, gbnf.encode("utf-8"), b"root"
    )
    if not probe:
        raise BadGrammar("llama.cpp could not parse the grammar built for this request")
    llama_cpp.llama_sampler_free(probe)
    return LlamaGrammar.from_string(gbnf)


def _seeds(request: dict[str, Any], count: int) -> list[int | None]:
    seed = request.get("seed")
    if seed is not None:
        return [int(seed) + i for i in range(count)]
    if count == 1:
        return [None]
    return [random.getrandbits(31) for _ in range(count)]


class _CallWatch:
    """Ends an answer once its newest call repeats an earlier one (see the module docstring)."""

    def __init__(self, should_stop: StopCheck | None) -> None:
        self.text = ""
        self.inner = should_stop

    def on_token(self, piece: str) -> None:
        self.text += piece

    def should_stop(self) -> str | None:
        reason = self.inner() if self.inner is not None else None
        if reason:
            return reason
        return "repeated_call" if tools.repeats(self.text) else None


def _needs_rewrite(request: dict[str, Any]) -> bool:
    if tools.call_plan(request) is not None:
        return True
    return any(
        m.get("role") in ("tool", "function") or m.get("tool_calls") or m.get("function_call")
        for m in request.get("messages") or ()
    )


def chat(model: LocalModel, request: dict[str, Any], hooks: Hooks) -> dict[str, Any]:
    """Answer a chat request (``n`` answers, tools, JSON mode); returns a chat.completion."""
    on_token, should_stop, score = hooks.on_token, hooks.should_stop, hooks.score
    plan = tools.call_plan(request)
    gbnf = grammar_mod.gbnf_for(request)
    grammar = _grammar(model, gbnf) if gbnf is not None else None
    prepared = dict(request)
    if _needs_rewrite(request):
        prepared["messages"] = tools.prompt_messages(request)
    n = int(request.get("n") or 1)
    if n > 1 and request.get("temperature") is None:
        prepared["temperature"] = 1.0  # OpenAI's default: n copies of one greedy answer are no use
    stream = on_token if n == 1 and plan is None else None
    answers: list[dict[str, Any]] = []
    for seed in _seeds(request, n):
        one = {**prepared, "seed": seed} if seed is not None else prepared
        if plan is not None and plan.most > 1:
            watch = _CallWatch(should_stop)
            answer = model.chat(
                one, on_token=watch.on_token, should_stop=watch.should_stop, grammar=grammar
            )
        else:
            answer = model.chat(one, on_token=stream, should_stop=should_stop, grammar=grammar)
        choice = answer["choices"][0]
        if answer["frugal"]["stop_cause"] == "repeated_call":
            choice["finish_reason"] = "stop"  # the answer is whole: the repeat is dropped
        cut = choice["finish_reason"] == "length"
        message, is_call = tools.to_message(choice["message"].get("content") or "", plan, cut=cut)
        answered = answered_calls(request.get("messages")) if is_call else frozenset()
        kept = tools.without_calls(message, answered) if answered else message
        aborted = answer["frugal"]["stop_cause"] in ABORTING
        if kept is None and plan is not None and plan.optional and not aborted:
            answer = _text_instead(model, one, request, should_stop, answer)
            choice = answer["choices"][0]
            message, is_call = choice["message"], False
        elif kept is not None:
            message = kept
        keep_reasoning(choice["message"], message)
        choice["message"] = message
        if is_call and plan is not None and choice["finish_reason"] == "stop":
            choice["finish_reason"] = tools.finish_reason(plan, request)
        answer["frugal"]["quality"] = score(request, answer)
        answers.append(answer)
        if answer["frugal"]["stop_cause"] in ABORTING:
            break
    return merge(answers)


def keep_reasoning(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Carry a thinking model's ``reasoning_content`` (``reasoning.py``) into the message made
    again from the answer's text."""
    if old.get("reasoning_content") is not None:
        new["reasoning_content"] = old["reasoning_content"]


def _text_instead(
    model: LocalModel,
    one: dict[str, Any],
    request: dict[str, Any],
    should_stop: StopCheck | None,
    first: dict[str, Any],
) -> dict[str, Any]:
    """A text answer in place of ``first``, whose calls had all been answered already: the
    conversation asked again with ``tool_choice: "none"`` and a grammar that lets no call in.
    The tokens spent on ``first`` are counted in the usage."""
    text = tools.text_request(
        {**request, **{k: one[k] for k in ("temperature", "seed") if k in one}}
    )
    grammar = _grammar(model, grammar_mod.TEXT_GBNF)
    answer = model.chat(text, on_token=None, should_stop=should_stop, grammar=grammar)
    spent = int(first["usage"]["completion_tokens"])
    usage = answer["usage"]
    usage["completion_tokens"] += spent
    usage["total_tokens"] += spent
    answer["frugal"]["answered_call_dropped"] = True
    answer["frugal"]["decode_s"] += first["frugal"]["decode_s"]
    return answer


def complete(model: LocalModel, request: dict[str, Any], hooks: Hooks) -> dict[str, Any]:
    """Answer a legacy completions request (every prompt, ``n`` times); a text_completion."""
    on_token, should_stop, score = hooks.on_token, hooks.should_stop, hooks.score
    prompt = request.get("prompt")
    prompts: list[Any]
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompts = list(prompt)
    else:
        prompts = [prompt]
    n = int(request.get("n") or 1)
    top = request.get("logprobs")
    base = {
        **request,
        "max_tokens": request.get("max_tokens") or legacy.DEFAULT_MAX_TOKENS,
        "logprobs": top is not None,
        "top_logprobs": int(top or 0),
    }
    if n > 1 and request.get("temperature") is None:
        base["temperature"] = 1.0
    stream = on_token if n == 1 and len(prompts) == 1 else None
    answers: list[dict[str, Any]] = []
    prompt_tokens = 0
    for text in prompts:
        prompt_tokens += _prompt_tokens_of(model, text)
        for seed in _seeds(request, n):
            one = {**base, "prompt": text}
            if seed is not None:
                one["seed"] = seed
            answer = model.complete(one, on_token=stream, should_stop=should_stop)
            answer["frugal"]["quality"] = score(*legacy.chat_view(one, answer))
            answers.append(answer)
            if answer["frugal"]["stop_cause"] in ABORTING:
                return merge(answers, prompt_tokens=prompt_tokens)
    return merge(answers, prompt_tokens=prompt_tokens)


def _prompt_tokens_of(model: LocalModel, prompt: Any) -> int:
    return len(legacy.prompt_of(model.llm, prompt)[0])


def _score_of(verdict: dict[str, Any]) -> float:
    value = verdict.get("value")
    return float(value) if value is not None else -1.0


def merge(answers: list[dict[str, Any]], *, prompt_tokens: int | None = None) -> dict[str, Any]:
    """One completion holding every answer as a choice; its score is the worst answer's.

    ``prompt_tokens`` counts several prompts (legacy completions); by default the prompt is the
    first answer's, shared by all.
    """
    first = answers[0]
    if len(answers) == 1:
        return first
    choices = []
    completion_tokens = 0
    for i, answer in enumerate(answers):
        choice = dict(answer["choices"][0])
        choice["index"] = i
        choices.append(choice)
        completion_tokens += int(answer["usage"]["completion_tokens"])
    if prompt_tokens is None:
        prompt_tokens = int(first["usage"]["prompt_tokens"])
    thinking = sum(
        int((a["usage"].get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
        for a in answers
    )
    # No score (an answer cut while thinking, proxy.engine.reasoning) is the worst of all.
    worst = min(answers, key=lambda a: _score_of(a["frugal"]["quality"]))
    aborted = next((a for a in answers if a["frugal"]["stop_cause"] in ABORTING), None)
    info = dict(first["frugal"])
    info.update(
        stop_cause=(aborted or worst)["frugal"]["stop_cause"],
        decode_s=sum(a["frugal"]["decode_s"] for a in answers),
        quality=worst["frugal"]["quality"],
        answers=len(answers),
    )
    return {
        **first,
        "choices": choices,
        "usage": {
            **first["usage"],
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            **(
                {"completion_tokens_details": {"reasoning_tokens": thinking}}
                if "completion_tokens_details" in first["usage"]
                else {}
            ),
        },
        "frugal": info,
    }
