"""What each kind of inference server does with a chat request (``[[local.backends]] kind``).

    KINDS          kind name -> :class:`Kind`, one per name in ``proxy.config.BACKEND_KINDS``
    Kind.refuses() why a request cannot be honoured there (it then goes to the bundled engine or
                   the API), or None
    Kind.adapt()   the request's body in that server's words

Servers differ in how they take a JSON schema, tools, ``n``, ``max_completion_tokens`` and
``logprobs``, and what they silently ignore: a request whose answer would break what the client
asked for is not sent there at all. The facts about ``llama-cpp-python`` were measured against
``python -m llama_cpp.server`` 0.3.36 serving SmolLM2 (tests/routing/test_llama_cpp_server.py
checks them); the others come from each server's documentation and are listed in
``docs/backends.md`` with where each came from.

``openai-compatible`` assumes nothing beyond plain chat: no ``n`` > 1, and a JSON schema and
tools sent as OpenAI's, as before kinds existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def refuses(self, request: dict[str, Any]) -> str | None:
        """Why this kind of server cannot honour ``request``, or None when it can."""
        n = request.get("n") or 1
        if n > self.max_n:
            return f"n = {n} (at most {self.max_n})"
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
        ),
        # another frugal serve, asked for its model "local": what the bundled engine honours
        Kind(name="frugal", max_n=8),
        # any other OpenAI-compatible server: plain chat, n = 1
        Kind(name="openai-compatible", max_n=1),
    )
}
