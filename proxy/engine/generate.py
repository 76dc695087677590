"""One chat completion on a loaded llama.cpp model, with token logprobs, in plain sync code.

This module runs inside the engine worker process (and in offline tools such as the quality
evaluation), never on the proxy's event loop. It drives ``Llama.generate`` token by token so that
it can:

* read the logprob of each sampled token from the last position's logits, through a logits
  processor, instead of paying for ``logits_all`` (n_ctx x n_vocab floats);
* stop within one token when asked to (deadline, client gone), and between prefill batches;
* report why it stopped, which the quality gate needs: a cut by the client's own ``max_tokens``
  is not a fault, a full context or a deadline is;
* hand each piece of text to a callback for live streaming, holding back text that may still turn
  out to be the start of a stop sequence.

The GGUF is found and opened by ``model_files.py``; a prompt's cached prefix (the live context
or the prefix cache) is reused by the rules of ``prefill_plan.py``, so that it never changes the
answer.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from proxy.engine import reasoning
from proxy.engine.answer import chat_completion
from proxy.engine.measure import Calibration
from proxy.engine.measure import calibrate as run_calibration
from proxy.engine.messages import template_messages
from proxy.engine.model_files import ModelLoadError, bundled_model_path, load_llama
from proxy.engine.prefill_plan import plan, reusable, tiled_until
from proxy.engine.prefix_cache import PrefixCache, common_prefix
from proxy.engine.sampling import (
    LogprobRecorder,
    SamplingParams,
    bias_processor,
    held_back,
    logprob_entry,
    with_logprobs,
)
from proxy.engine.speculative import (
    LlamaDraftModel,
    PromptLookup,
    SpecStats,
    Speculator,
    Step,
)

# ModelLoadError and bundled_model_path live in model_files.py; callers outside the engine
# import them from here too.
__all__ = [
    "LocalModel",
    "ModelLoadError",
    "PromptTooLong",
    "StopCheck",
    "TokenCallback",
    "bundled_model_path",
]

TokenCallback = Callable[[str], None]
StopCheck = Callable[[], str | None]


class PromptTooLong(Exception):
    """The prompt plus the room asked for the answer does not fit in the context."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(f"prompt of {prompt_tokens} tokens does not fit a {n_ctx}-token context")
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class LocalModel:
    """A loaded GGUF with its chat template. Not thread-safe: one generation at a time."""

    def __init__(self, llm: Any, *, path: str, default_max_tokens: int = 512) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.llm = llm
        self.path = path
        self.default_max_tokens = default_max_tokens
        # Set by load(): speculative decoding for greedy requests, saved prefix states and the
        # start-up measurements. A bare LocalModel(llm) does none of these.
        self.speculator: Speculator | None = None
        self.prefix_cache: PrefixCache | None = None
        self.calibration: Calibration | None = None
        self.draft_llm: Any = None
        self.n_ctx: int = int(llm.n_ctx())
        self.n_batch: int = int(llm.n_batch)
        self._live_tiled = 0  # prefill_plan.tiled_until of the prompt the live cells came with
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelLoadError(f"{path}: the GGUF has no chat template (tokenizer.chat_template)")
        eos = llm.token_eos()
        bos = llm.token_bos()
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        )
        self.model_name = os.path.basename(path)
        # A model that thinks before it answers (reasoning.py), and the most tokens an answer
        # may think for (``[local] thinking_budget``, set by load()).
        self.thinking = reasoning.detect(template, self._count_tokens)
        self.thinking_budget = reasoning.DEFAULT_BUDGET

    @classmethod
    def load(
        cls,
        path: str,
        *,
        n_ctx: int = 4096,
        n_threads: int = 1,
        seed: int = 0,
        speculative: str = "off",
        default_max_tokens: int = 512,
        draft_model_path: str = "",
        draft_max_tokens: int = 8,
        lookup_ngram: int = 3,
        prefix_cache_mb: int = 0,
        calibrate: bool = True,
        adaptive: bool = True,
        flash_attn: bool = True,
        thinking_budget: int = 0,
    ) -> LocalModel:
        """Load a GGUF. Speculation is done by our own batch loop (see ``speculative.py``):
        no ``draft_model`` is given to ``Llama``, which would force ``logits_all``."""
        llm = load_llama(path, n_ctx=n_ctx, n_threads=n_threads, seed=seed, flash_attn=flash_attn)
        model = cls(llm, path=path, default_max_tokens=default_max_tokens)
        if thinking_budget > 0:
            model.thinking_budget = thinking_budget
        drafter: Any = None
        if speculative == "prompt-lookup":
            drafter = PromptLookup(ngram_max=lookup_ngram)
        elif speculative == "draft":
            if not draft_model_path:
                raise ModelLoadError('speculative = "draft" needs a draft_model_path')
            model.draft_llm = load_llama(
                draft_model_path,
                n_ctx=model.n_ctx,
                n_threads=n_threads,
                seed=seed,
                flash_attn=flash_attn,
            )
            if model.draft_llm.n_vocab() != llm.n_vocab():
                raise ModelLoadError(
                    f"draft model {draft_model_path} has a vocabulary of "
                    f"{model.draft_llm.n_vocab()} tokens, the model {path} has {llm.n_vocab()}: "
                    "a draft model must share the main model's vocabulary"
                )
            drafter = LlamaDraftModel(model.draft_llm, eog=model.is_eog)
        if calibrate:
            model.calibration = run_calibration(llm, draft_llm=model.draft_llm)
        if drafter is not None:
            if model.calibration is not None and isinstance(drafter, LlamaDraftModel):
                drafter.cost_per_token_s = model.calibration.draft_token_s
            model.speculator = Speculator(
                llm,
                drafter,
                max_draft=draft_max_tokens,
                cost=model.calibration.verify if model.calibration is not None else None,
                adaptive=adaptive,
            )
        if prefix_cache_mb > 0:
            model.prefix_cache = PrefixCache(llm, max_bytes=prefix_cache_mb * 1024 * 1024)
        return model

    def close(self) -> None:
        """Free the native model(s), context(s) and batch now rather than at garbage collection."""
        if self.speculator is not None:
            self.speculator.close()
        for llm in (self.draft_llm, self.llm):
            if llm is not None:
                llm.close()

    def forget(self) -> None:
        """Drop the evaluated context (the live KV cache, not the saved prefixes).

        The next request prefills from scratch, as the first one after start does. llama.cpp's
        numbers depend slightly on how a prompt was split into batches, so comparisons of
        outputs (and cold-start benchmarks) start from here.
        """
        self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = 0
        self.llm._requires_eval = True
        self._live_tiled = 0

    def is_eog(self, token: int) -> bool:
        from llama_cpp import llama_vocab_is_eog

        return bool(llama_vocab_is_eog(self.llm._model.vocab, token))

    def speculation_allowed(self, request: dict[str, Any], params: SamplingParams) -> bool:
        """Speculate only where the greedy choice is a plain argmax of the logits: no sampling,
        no penalties, no grammar (JSON mode, tools)."""
        if self.speculator is None or params.temperature > 0:
            return False
        if params.presence_penalty or params.frequency_penalty:
            return False
        response_format = request.get("response_format") or {}
        if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
            return False
        return not request.get("tools")

    # -- prompt -----------------------------------------------------------------------------

    def _count_tokens(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def _render(self, request: dict[str, Any]) -> Any:
        messages: Any = template_messages(request.get("messages") or [])
        if self.thinking is not None and self.thinking.switch:
            thinks = reasoning.enable_thinking(request)
            return self._formatter(messages=messages, enable_thinking=thinks)
        return self._formatter(messages=messages)

    def prompt_tokens(self, request: dict[str, Any]) -> list[int]:
        rendered = self._render(request)
        tokens: list[int] = self.llm.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        return tokens

    def watch_thinking(
        self, request: dict[str, Any], on_token: TokenCallback | None
    ) -> reasoning.Watch | None:
        """The watch over this chat request's thinking (``reasoning.Watch``), or None when the
        model does not think."""
        if self.thinking is None:
            return None
        opened = reasoning.opens_thinking(self._render(request).prompt, self.thinking)
        budget = reasoning.budget_of(request, self.thinking_budget)
        return reasoning.Watch(self.thinking, opened, budget, on_token)

    def _prefill(self, tokens: list[int], should_stop: StopCheck | None) -> tuple[int, str | None]:
        """Evaluate all but the last prompt token, reusing the cached prefix, step by step.

        Returns the number of prompt tokens that were already in the KV cache, and a stop reason
        if ``should_stop`` fired between steps. ``Llama.generate`` then finds everything but
        the last token cached and evaluates just that one. A prefix is reused (from the live
        context or the prefix cache) only as far as its cells were evaluated as a cold prefill
        of this prompt would evaluate them, and the rest is cut to keep it so
        (``prefill_plan.py``): the answer is the one the prompt gets from an empty context.
        """
        llm = self.llm
        wanted = np.asarray(tokens, dtype=np.intc)
        tiled = tiled_until(len(tokens), self.n_batch)
        common = common_prefix(llm.input_ids[: llm.n_tokens], wanted)
        cached = reusable(common, self._live_tiled, tiled)
        cache = self.prefix_cache
        if cache is not None:
            entry, hit = cache.best(wanted, tiled)
            if llm.n_tokens - cached >= cache.min_tokens:
                cache.save(self._live_tiled)  # the live state is about to be cut: keep it
            if entry is not None and hit >= cached + 16:
                cached = hit if cache.restore(entry) else 0
                self._live_tiled = entry.tiled
        cached, steps = plan(cached, len(tokens), self.n_batch)
        if cached < llm.n_tokens:
            if not llm._ctx.kv_cache_seq_rm(-1, cached, -1):
                # Some caches (sliding-window attention) cannot drop a tail: start afresh.
                llm._ctx.kv_cache_clear()
                cached, steps = plan(0, len(tokens), self.n_batch)
            llm.n_tokens = cached
        self._live_tiled = tiled
        position = cached
        for size in steps:
            if should_stop is not None:
                reason = should_stop()
                if reason:
                    return cached, reason
            llm.eval(tokens[position : position + size])
            position += size
        return cached, None

    # -- generation -------------------------------------------------------------------------

    def chat(
        self,
        request: dict[str, Any],
        *,
        on_token: TokenCallback | None = None,
        should_stop: StopCheck | None = None,
        grammar: Any = None,
        prompt: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """Answer one chat request; returns an OpenAI ``chat.completion`` dict.

        ``grammar`` (a ``LlamaGrammar``, see ``grammar.py``) constrains the sampled tokens;
        ``prompt`` replaces the chat-templated prompt with these tokens (see :meth:`complete`).

        ``completion["frugal"]`` adds what the proxy needs: ``stop_cause`` (eos, stop_sequence,
        max_tokens, context_full, or the reason ``should_stop`` returned), timings and the number
        of prompt tokens served from the cache.
        """
        from llama_cpp import LogitsProcessorList, llama_vocab_is_eog

        llm = self.llm
        params = SamplingParams.from_request(request, self.default_max_tokens)
        started = time.perf_counter()
        tokens = self.prompt_tokens(request) if prompt is None else list(prompt)
        n_prompt = len(tokens)
        if n_prompt >= self.n_ctx:
            raise PromptTooLong(n_prompt, self.n_ctx)
        budget = min(params.max_tokens, self.n_ctx - n_prompt)

        if params.seed is not None:
            llm.set_seed(int(params.seed))
        recorder = LogprobRecorder()
        processors: list[Any] = [recorder]
        if params.logit_bias:
            processors.append(bias_processor(params.logit_bias))

        watch = self.watch_thinking(request, on_token) if prompt is None else None
        if watch is not None:
            on_token = watch.on_token
        cached, stop_cause = self._prefill(tokens, should_stop)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = ""
        emitted = 0
        generated: list[int] = []
        entries: list[dict[str, Any]] = []
        first_token_at: float | None = None
        finish_reason = "stop"
        spec: SpecStats | None = None

        if stop_cause is None and grammar is None and self.speculation_allowed(request, params):
            assert self.speculator is not None
            spec = SpecStats(mode=self.speculator.drafter.name)
            steps: Generator[Step, None, None] = self.speculator.generate(
                tokens,
                limit=budget,
                top=params.top_logprobs,
                bias=params.logit_bias,
                stats=spec,
            )
        elif stop_cause is None:
            stream = llm.generate(
                tokens,
                temp=params.temperature,
                top_p=params.top_p,
                top_k=40 if params.temperature > 0 else 1,
                min_p=0.05 if params.temperature > 0 else 0.0,
                frequency_penalty=params.frequency_penalty,
                presence_penalty=params.presence_penalty,
                logits_processor=LogitsProcessorList(processors),
                grammar=grammar,
            )
            steps = with_logprobs(stream, recorder, params.top_logprobs)
        if stop_cause is None:
            for token, logprob, best in steps:
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if llama_vocab_is_eog(llm._model.vocab, token):
                    stop_cause = "eos"
                    break
                piece = llm.detokenize([token], prev_tokens=tokens + generated)
                generated.append(token)
                entries.append(logprob_entry(llm, piece, logprob, best))
                text += decoder.decode(piece)
                cut = next((text.find(s) for s in params.stop if s in text), -1)
                if cut >= 0:
                    text = text[:cut]
                    stop_cause = "stop_sequence"
                    break
                if on_token is not None:
                    safe = len(text) - held_back(text, params.stop)
                    if safe > emitted:
                        on_token(text[emitted:safe])
                        emitted = safe
                if len(generated) >= budget:
                    stop_cause = "max_tokens" if budget == params.max_tokens else "context_full"
                    finish_reason = "length"
                    break
                if watch is not None and watch.over_budget(text, len(generated)):
                    stop_cause = "thinking_budget"
                    finish_reason = "length"
                    break
                if should_stop is not None:
                    reason = should_stop()
                    if reason:
                        stop_cause = reason
                        finish_reason = "length"
                        break
            steps.close()
        else:
            finish_reason = "length"
        text += decoder.decode(b"", final=True)
        if on_token is not None and len(text) > emitted:
            on_token(text[emitted:])
        done = time.perf_counter()
        first = first_token_at or done
        completion = chat_completion(
            model=self.model_name,
            text=text,
            entries=entries,
            finish_reason=finish_reason,
            prompt_tokens=n_prompt,
            completion_tokens=len(generated),
            cached_tokens=cached,
            prefilled_tokens=n_prompt - cached,
            stop_cause=stop_cause,
            prefill_s=first - started,
            decode_s=done - first,
            speculative=spec.as_dict() if spec is not None else None,
        )
        if watch is not None:
            watch.close()
            watch.apply(completion)
        return completion

    def complete(
        self,
        request: dict[str, Any],
        *,
        on_token: TokenCallback | None = None,
        should_stop: StopCheck | None = None,
    ) -> dict[str, Any]:
        """Continue a raw text prompt, without the chat template (legacy ``/v1/completions``).

        ``request["prompt"]`` is a string, or token ids of this model. Returns an OpenAI
        ``text_completion`` dict with one choice and the same ``frugal`` details as :meth:`chat`.
        """
        from proxy.engine import legacy

        tokens, text = legacy.prompt_of(self.llm, request.get("prompt"))
        completion = self.chat(request, on_token=on_token, should_stop=should_stop, prompt=tokens)
        return legacy.text_completion(completion, prompt_text=text, request=request)
