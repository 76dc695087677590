"""llama.cpp grammars (GBNF) that make structured answers valid by construction.

    response_format json_object   ->  any JSON object
    response_format json_schema   ->  JSON fitting the schema (llama.cpp's schema converter)
    tools, a call required        ->  {"name": <one of the tools>, "arguments": <its schema>}
    tools, tool_choice "auto"     ->  such a call, or text that does not start with "{"
    an answered call redone       ->  text that does not start with "{" (TEXT_GBNF)
    parallel_tool_calls not false ->  one to MAX_CALLS such calls, one per line, in place of one

The text is pure Python (``llama_cpp.llama_grammar`` converts schemas without touching a model),
so the proxy can check at planning time that a schema converts, and the worker builds the same
text again (cached) to constrain sampling. A schema the converter cannot handle sends the request
to the API; keywords it ignores (``not``, ``if``...) make the grammar looser than the schema, and
the quality gate's schema check catches what slips through.

Where it runs, and why that is bounded: :func:`grammar_blocker` runs at planning time, on the
proxy's event loop, and only sizes the grammar (:mod:`proxy.engine.grammar_size`: a walk linear
in the schema that bounds what the converter would build, refused past its limits); the converter
runs in the engine worker process alone, which builds the text to constrain sampling, so no
client schema costs the event loop more than a linear walk. A schema the converter refuses there
fails that request with reason ``unsupported``, and it goes to the API like one refused at
planning time. Only a sized schema is converted, so the conversion in the worker takes a
millisecond for an everyday schema and, for the worst one within the limits (rules whose names
collide, which the converter resolves by a linear scan, or 140 optional properties), about 75 ms
on the 2 shared development cores; its result is cached. Past a limit, :class:`GrammarError`
sends the request to the API (reason ``unsupported``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from proxy.engine.grammar_size import MAX_GRAMMAR_CHARS, TEXT_RULE, call_schema, refusal
from proxy.engine.tools import call_plan

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
TEXT_GBNF = "root ::= " + TEXT_RULE
"""A text answer where a call was allowed: what the engine asks for when its model made again
a call already answered (:mod:`proxy.engine.tasks`), so that it cannot be a call either."""
MAX_CACHED_SPEC = 64 * 1024
"""Longest spec (the schemas as JSON) whose grammar is cached: 128 keys of 8 MiB in all at most."""


class GrammarError(Exception):
    """A schema the grammar converter cannot turn into GBNF."""


def _converter() -> Any:
    from llama_cpp import llama_grammar

    converter: Any = llama_grammar.SchemaConverter
    return converter(
        prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _size(data: Any) -> None:
    """Refuse a spec whose grammar would pass the limits (:mod:`proxy.engine.grammar_size`)."""
    why = refusal(data)
    if why is not None:
        raise GrammarError(why)


@lru_cache(maxsize=128)
def _sized(spec: str) -> None:
    _size(json.loads(spec))


@lru_cache(maxsize=128)
def _build(spec: str) -> str:
    """GBNF text for a canonical JSON ``spec``:
    {"json": schema|None, "calls": [...], "auto": b, "most": calls per answer}."""
    data = json.loads(spec)
    _size(data)
    conv = _converter()
    try:
        calls = data.get("calls")
        if calls:
            resolved = conv.resolve_refs(call_schema(calls), "tools")
            call_rule = conv.visit(resolved, "call")
            most = int(data.get("most") or 1)
            if most > 1:
                call_rule = conv._add_rule(
                    "calls", f'{call_rule} ("\\n" {call_rule}){{0,{most - 1}}}'
                )
            if not data.get("auto"):
                conv._add_rule("root", call_rule)
            elif data.get("json") is not None:
                answer = conv.visit(conv.resolve_refs(data["json"], "response"), "answer")
                conv._add_rule("root", f"{call_rule} | {answer}")
            else:
                conv._add_rule("text", TEXT_RULE)
                conv._add_rule("root", f"{call_rule} | text")
        else:
            conv.visit(conv.resolve_refs(data["json"], "response"), "")
        text = str(conv.format_grammar())
    except GrammarError:
        raise
    except Exception as exc:  # the converter raises bare exceptions on what it cannot do
        raise GrammarError(f"{type(exc).__name__}: {exc}") from exc
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar would take {len(text)} characters")
    return text


def spec_for(request: dict[str, Any]) -> str | None:
    """The canonical grammar spec a request needs, or None for free text."""
    json_schema: Any = None
    fmt = request.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_object":
            json_schema = JSON_OBJECT_SCHEMA
        elif fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            json_schema = spec.get("schema")
            if json_schema is None or json_schema is True or json_schema == {}:
                json_schema = JSON_OBJECT_SCHEMA
    plan = call_plan(request)
    if plan is None:
        if json_schema is None:
            return None
        return json.dumps({"json": json_schema}, sort_keys=True)
    calls = [[name, params] for name, params in plan.functions]
    spec = {"json": json_schema, "calls": calls, "auto": plan.optional, "most": plan.most}
    return json.dumps(spec, sort_keys=True)


def gbnf_for(request: dict[str, Any]) -> str | None:
    """GBNF text for a request, None when it needs none; raises GrammarError."""
    spec = spec_for(request)
    if spec is None:
        return None
    # The cache keeps its keys: a spec padded with descriptions is built afresh, not kept.
    return _build(spec) if len(spec) <= MAX_CACHED_SPEC else _build.__wrapped__(spec)


def grammar_blocker(request: dict[str, Any]) -> str | None:
    """Why no grammar can be built for this request (so the API must answer it), or None.

    Runs on the proxy's event loop, so it only sizes the grammar
    (:class:`~proxy.engine.grammar_size.Sizer`, linear in the schema) and never runs the
    converter; the worker process builds the grammar, and a schema the converter then refuses
    comes back from the worker as reason ``unsupported``.
    """
    spec = spec_for(request)
    if spec is None:
        return None
    try:
        if len(spec) <= MAX_CACHED_SPEC:
            _sized(spec)
        else:
            _size(json.loads(spec))
    except GrammarError as exc:
        return f"a schema the local grammar cannot express ({exc})"
    return None
