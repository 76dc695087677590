"""What each kind of inference server does with a chat request (``[[local.backends]] kind``).

    KINDS          kind name -> :class:`Kind`, one per name in ``proxy.config.BACKEND_KINDS``
    Kind.refuses() why a request cannot be honoured there (it then goes to the bundled engine or
                   the API), or None; ``kind="complete"`` for a legacy ``/v1/completions`` one
    Kind.adapt()   the request's body in that server's words (``adapt_completion``: a legacy
                   completion's)

Servers differ in how they take a JSON schema, tools, ``n``, ``max_completion_tokens`` and
``logprobs``, and what they silently ignore: a request whose answer would break what the client
asked for is not sent there at all. The facts about ``llama-cpp-python`` were measured against
``python -m llama_cpp.server`` 0.3.36 serving SmolLM2 (tests/routing/test_llama_cpp_server.py
checks them); the others come from each server's documentation and are listed in
``docs/backends.md`` with where each came from.

``openai-compatible`` assumes nothing beyond plain chat: no ``n`` > 1 in one request, and a
JSON schema and tools sent as OpenAI's, as before kinds existed.

``n`` above what a server answers in one request (``Kind.max_n``; llama-cpp-python ignores
``n``) is made up for by the proxy: ``Kind.calls`` requests of one answer each, each with its
own seed, each scored (``proxy.routing.remote_wire.split_n`` and ``merge_answers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.routing.servable import MAX_LOCAL_N

__all__ = ["KINDS", "Kind"]

# How a server takes response_format json_schema:
#   "native"       as OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}}
#   "json_object"  only as {"type": "json_object", "schema": ...} (llama-cpp-python: 500 else)
#   "none"         not at all
# Tools:
#   "any"          tool_choice auto, required, none and a named function
#   "named"        only a tool_choice naming a function; auto and required are ignored
#   "auto"         tools without tool_choice (auto); a named or required choice is ignored
#   "none"         tools are ignored
# Logprobs:
#   "yes"          logprobs: true gives them
#   "with_top"     only with top_logprobs >= 1 as well
#   "none"         never


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind of server: what it honours, and how it is asked."""

    name: str
    json_schema: str = "native"
    tools: str = "any"
    max_n: int = 1
    max_completion_tokens: bool = True  # False: sent as max_tokens, which it honours
    logprobs: str = "yes"
    # Whether the gate asks for logprobs the client did not: False where they cost too much
    # (llama-cpp-python computes them in Python: 64 tokens took 7.17 s with, 1.68 s without).
    gate_logprobs: bool = True
    stream_usage: bool = True  # a stream with include_usage ends with a usage chunk
    # The health probe: relative to api_base ("models"), or from the server's root ("/docs").
    probe_path: str = "models"
    # One model lock: a request that arrives during a stream, a health probe included, cuts
    # that stream. It is sent one request at a time and never probed while it answers.
    one_at_a_time: bool = False
    # It answers only for the models it lists, and its answer names the model that answered:
    # a model missing from its list, or another model in an answer, marks it down.
    names_model: bool = False
    # It answers legacy text completions (POST {api_base}/completions), one string prompt each.
    completions: bool = True
    # n above max_n: asked as n requests of one answer each (up to MAX_LOCAL_N), not refused
    split_n: bool = True

    def calls(self, request: dict[str, Any]) -> int:
        """How many requests one request is sent as: 1, or ``n`` when ``n`` is above what this
        server answers in one request and the proxy makes up for it."""
        n = request.get("n") or 1
        return n if n > self.max_n and self.split_n else 1

    def _refuses_n(self, request: dict[str, Any]) -> str | None:
        n = request.get("n") or 1
        most = MAX_LOCAL_N if self.split_n else self.max_n
        return f"n = {n} (at most {most})" if n > most else None

    def refuses(self, request: dict[str, Any], kind: str = "chat") -> str | None:
        """Why this kind of server cannot honour ``request``, or None when it can; ``kind``:
        ``chat``, or ``complete`` for a legacy text completion."""
        if kind == "complete":
            return self._refuses_completion(request)
        too_many = self._refuses_n(request)
        if too_many is not None:
            return too_many
        fmt = request.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            if self.json_schema == "none":
                return "response_format json_schema"
        tools = bool(request.get("tools") or request.get("functions"))
        choice = request.get("tool_choice", request.get("function_call"))
        if tools and choice != "none":
            named = isinstance(choice, dict)
            if self.tools == "none":
                return "tools"
            if self.tools == "named" and not named:
                return f"tools with tool_choice {choice or 'auto'} (only a named tool is honoured)"
            if self.tools == "auto" and (named or choice == "required"):
                return f"tool_choice {'named' if named else choice} (only auto is honoured)"
        if request.get("logprobs") and self.logprobs == "none":
            return "logprobs"
        return None

    def _refuses_completion(self, request: dict[str, Any]) -> str | None:
        """A legacy completion goes to a server with one string prompt and nothing that names
        the bundled model's tokens; what the engine alone does (``echo``, ``suffix``,
        ``best_of``) stays with it."""
        if not self.completions:
            return "legacy completions"
        prompt = request.get("prompt")
        if isinstance(prompt, list):
            if not all(isinstance(p, str) for p in prompt):
                return "a token-id prompt (ids of the bundled model's tokenizer)"
            if len(prompt) != 1:
                return "several prompts"
        too_many = self._refuses_n(request)
        if too_many is not None:
            return too_many
        for name in ("echo", "suffix", "logit_bias"):
            if request.get(name):
                return name
        if (request.get("best_of") or 1) > 1:
            return "best_of > 1"
        if request.get("logprobs") is not None and self.logprobs == "none":
            return "logprobs"
        return None

    def adapt_completion(self, body: dict[str, Any], *, gate_logprobs: bool) -> dict[str, Any]:
        """A legacy completion's ``body`` in this server's words: one string prompt, and
        ``logprobs`` (a count there) asked for the gate when the client did not ask."""
        out = dict(body)
        prompt = out.get("prompt")
        if isinstance(prompt, list):
            out["prompt"] = prompt[0] if prompt else ""
        out.pop("max_completion_tokens", None)  # not a legacy field: the cap is max_tokens
        if self.logprobs == "none":
            out.pop("logprobs", None)
        elif gate_logprobs and out.get("logprobs") is None:
            out["logprobs"] = 1
        return out

    def adapt(self, body: dict[str, Any], *, gate_logprobs: bool) -> dict[str, Any]:
        """``body`` (the request as it would go to the API) in this server's words.

        ``gate_logprobs``: the proxy asks for logprobs for the quality gate, though the client
        may not have; the entries' top logprobs are then dropped from the answer it is given.
        """
        out = dict(body)
        fmt = out.get("response_format")
        if self.json_schema == "json_object" and isinstance(fmt, dict):
            if fmt.get("type") == "json_schema":
                schema = (fmt.get("json_schema") or {}).get("schema")
                out["response_format"] = {"type": "json_object"}
                if isinstance(schema, dict) and schema:
                    out["response_format"]["schema"] = schema
        if not self.max_completion_tokens and "max_completion_tokens" in out:
            cap = out.pop("max_completion_tokens")
            if cap is not None:
                out["max_tokens"] = min(cap, out.get("max_tokens") or cap)
        if self.logprobs == "none":
            out.pop("logprobs", None)
            out.pop("top_logprobs", None)
        elif gate_logprobs or out.get("logprobs"):
            out["logprobs"] = True
            if self.logprobs == "with_top" and not out.get("top_logprobs"):
                out["top_logprobs"] = 1
        if self.tools == "named" and not _named(out):
            # Ignored there anyway; sent without, a tool-less answer is asked for plainly.
            out.pop("tools", None)
            out.pop("tool_choice", None)
        return out


def _named(body: dict[str, Any]) -> bool:
    return bool(body.get("tools")) and isinstance(body.get("tool_choice"), dict)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        # python -m llama_cpp.server 0.3.36, measured (tests/routing/test_llama_cpp_server.py)
        Kind(
            name="llama-cpp-python",
            json_schema="json_object",
            tools="named",
            max_n=1,
            max_completion_tokens=False,
            logprobs="with_top",
            gate_logprobs=False,
            stream_usage=False,
            probe_path="/docs",  # FastAPI's page: answered without the model lock
            one_at_a_time=True,
        ),
        # llama.cpp's C++ server (llama-server --jinja for tools): documented, not measured
        # here; max_tokens is its documented cap, so the cap goes as that
        Kind(name="llama-server", max_n=1, max_completion_tokens=False, probe_path="/health"),
        # vLLM's OpenAI server: n, schemas (guided decoding), named and auto tools (auto with
        # --enable-auto-tool-choice); documented, not measured here
        Kind(name="vllm", max_n=8, probe_path="/health", names_model=True),
        # Ollama's /v1: no tool_choice, no n, no logprobs assumed, the cap as max_tokens;
        # documented, not measured here
        Kind(
            name="ollama",
            tools="auto",
            max_n=1,
            max_completion_tokens=False,
            logprobs="none",
            names_model=True,
            completions=False,  # its /v1/completions is not relied on here
        ),
        # another frugal serve, asked for its model "local": what the bundled engine honours
        Kind(name="frugal", max_n=8),
        # any other OpenAI-compatible server: plain chat, n = 1
        Kind(name="openai-compatible", max_n=1),
    )
}
