"""Tool (and deprecated function) calling on the local model.

Small local models have no native tool-calling format that every GGUF shares, so this module
uses one of its own, the same for every model:

- **Prompt.** The tools are described in the system message, with the calling convention: a call
  is a JSON object ``{"name": ..., "arguments": {...}}`` and nothing else. Earlier calls in the
  conversation (assistant ``tool_calls`` or ``function_call``) are written back in that form, and
  ``tool`` / ``function`` results become user turns that name the call they answer, so that any
  chat template (even one that knows only system, user and assistant) can render them.
- **Grammar.** :mod:`proxy.engine.grammar` constrains the answer to such a call when one is
  required (``tool_choice`` ``required`` or a named function), and to "a call or text that does
  not start with ``{``" for ``auto``. A call is valid JSON that fits the tool's schema by
  construction.
- **Answer.** :func:`to_message` turns the generated text into an OpenAI assistant message with
  ``tool_calls`` (or ``function_call`` for a ``functions`` request).

The model calls one tool per answer, which satisfies ``parallel_tool_calls`` either way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from proxy.engine.messages import text_of


@dataclass(frozen=True)
class CallPlan:
    functions: tuple[tuple[str, dict[str, Any] | None], ...]
    """(name, parameters schema) of each function the answer may call."""
    described: tuple[dict[str, Any], ...]
    """Every function definition shown to the model."""
    optional: bool
    """True for "auto": the model may answer with text instead."""
    legacy: bool
    """The request used ``functions`` / ``function_call`` (answer with ``function_call``)."""


def _definitions(request: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    if request.get("tools"):
        return [
            t["function"]
            for t in request["tools"]
            if t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
        ], False
    return [f for f in request.get("functions") or () if isinstance(f, dict)], True


def call_plan(request: dict[str, Any]) -> CallPlan | None:
    """What calls the answer may make, or None when it must be text."""
    definitions, legacy = _definitions(request)
    if not definitions:
        return None
    choice = request.get("function_call") if legacy else request.get("tool_choice")
    if choice == "none":
        return None
    named: str | None = None
    if isinstance(choice, dict):
        fn = choice.get("function") if not legacy else choice
        named = fn.get("name") if isinstance(fn, dict) else None
    chosen = [d for d in definitions if named is None or d.get("name") == named]
    return CallPlan(
        functions=tuple((str(d["name"]), d.get("parameters")) for d in chosen),
        described=tuple(definitions),
        optional=named is None and choice != "required",
        legacy=legacy,
    )


def _instructions(plan: CallPlan) -> str:
    listed = [
        {
            "name": d.get("name"),
            "description": d.get("description", ""),
            "parameters": d.get("parameters") or {"type": "object", "properties": {}},
        }
        for d in plan.described
    ]
    lines = [
        "You can call these functions:",
        json.dumps(listed, ensure_ascii=False),
        'To call a function, reply with only a JSON object: {"name": "<function name>", '
        '"arguments": {<the arguments>}}.',
    ]
    if plan.optional:
        lines.append("If no function is needed, answer in plain text instead.")
    else:
        lines.append("You must call a function now.")
    return "\n".join(lines)


def _call_text(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def prompt_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as plain system/user/assistant text turns for the chat template."""
    plan = call_plan(request)
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for message in request.get("messages") or ():
        role = message.get("role")
        content = text_of(message.get("content"))
        if role == "developer":
            role = "system"
        if role == "assistant":
            calls = []
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                names[str(call.get("id"))] = str(fn.get("name", ""))
                calls.append(_call_text(str(fn.get("name", "")), fn.get("arguments")))
            legacy = message.get("function_call")
            if isinstance(legacy, dict):
                calls.append(_call_text(str(legacy.get("name", "")), legacy.get("arguments")))
            content = "\n".join([c for c in (content, *calls) if c])
        elif role in ("tool", "function"):
            call_id = message.get("tool_call_id")
            name = message.get("name") or names.get(str(call_id), "")
            label = f"Result of {name}" if name else "Result"
            if call_id:
                label += f" (call {call_id})"
            content = f"{label}:\n{content}"
            if out and out[-1].get("frugal_result"):
                out[-1]["content"] += "\n\n" + content
                continue
            out.append({"role": "user", "content": content, "frugal_result": True})
            continue
        out.append({"role": role, "content": content})
    for item in out:
        item.pop("frugal_result", None)
    if plan is not None:
        instructions = _instructions(plan)
        if out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"] + "\n\n" + instructions).strip()
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def to_message(text: str, plan: CallPlan | None) -> tuple[dict[str, Any], bool]:
    """The assistant message for generated ``text``; True when it is a call."""
    if plan is not None and text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        names = {name for name, _ in plan.functions}
        if isinstance(data, dict) and data.get("name") in names and "arguments" in data:
            arguments = json.dumps(data["arguments"], ensure_ascii=False)
            if plan.legacy:
                call = {"name": data["name"], "arguments": arguments}
                return {
                    "role": "assistant",
                    "content": None,
                    "function_call": call,
                    "refusal": None,
                }, True
            tool_call = {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": data["name"], "arguments": arguments},
            }
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call],
                "refusal": None,
            }, True
    return {"role": "assistant", "content": text, "refusal": None}, False


def finish_reason(plan: CallPlan, request: dict[str, Any]) -> str:
    """OpenAI's finish reason for a call: "stop" when the client named the function."""
    if plan.legacy:
        return "stop" if isinstance(request.get("function_call"), dict) else "function_call"
    return "stop" if isinstance(request.get("tool_choice"), dict) else "tool_calls"
