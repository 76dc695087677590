"""Tool (and deprecated function) calling on the local model.

Small local models have no native tool-calling format that every GGUF shares, so this module
uses one of its own, the same for every model:

- **Prompt.** The tools are described in the system message, with the calling convention: a call
  is a JSON object ``{"name": ..., "arguments": {...}}`` and nothing else. Earlier calls in the
  conversation (assistant ``tool_calls`` or ``function_call``) are written back in that form, and
  ``tool`` / ``function`` results become user turns that name the call they answer, so that any
  chat template (even one that knows only system, user and assistant) can render them.
- **Grammar.** :mod:`proxy.engine.grammar` constrains the answer to calls when one is
  required (``tool_choice`` ``required`` or a named function), and to "calls or text that does
  not start with ``{``" for ``auto``. A call is valid JSON that fits the tool's schema by
  construction.
- **Several calls.** Unless ``parallel_tool_calls`` is false, an answer may make up to
  :data:`MAX_CALLS` calls, one JSON object per line (the form earlier turns are written back in).
  A named function, ``parallel_tool_calls: false`` and the deprecated ``functions`` allow exactly
  one call, as OpenAI's ``function_call`` holds one. A small model may repeat a call it has just
  made instead of ending its answer: a call with the same name and arguments as an earlier one
  in the answer is made once, and :func:`repeats` lets the engine stop at the first repeat
  rather than loop until the bound or ``max_tokens``.
- **Answer.** :func:`to_message` turns the generated text into an OpenAI assistant message with
  ``tool_calls``, one entry with its own ``call_...`` id per call (or ``function_call`` for a
  ``functions`` request). Text that is not wholly a run of valid calls stays text, for the
  quality gate to judge.
- **A call cut off.** When ``max_tokens`` ends the answer inside a call, the grammar's JSON is
  never handed out as text: the answer is what OpenAI returns then, the calls made so far and
  the last one with its arguments as far as they came (``finish_reason`` stays ``"length"``).
  The grammar only lets a call name one of the tools, so a name cut short still says which one
  when one tool's name starts so; when it fits several (or none came), that call is dropped, and
  an answer left with no call has empty content.
- **Calls already answered.** :func:`answered_calls` lists the calls of the current turn (since
  the user's last message) whose results are in the conversation and are not errors; the engine
  (:mod:`proxy.engine.tasks`) does not hand back such a call again, since an agent that gets the
  same call for the same result loops until its step limit.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from proxy.engine.messages import text_of
from quality.turns import call_key

MAX_CALLS = 8
"""Most calls one local answer may make, which keeps the grammar and the answer bounded."""


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
    most: int = 1
    """How many calls one answer may make: :data:`MAX_CALLS`, or 1 (see the module docstring)."""


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
    several = not legacy and named is None and request.get("parallel_tool_calls") is not False
    return CallPlan(
        functions=tuple((str(d["name"]), d.get("parameters")) for d in chosen),
        described=tuple(definitions),
        optional=named is None and choice != "required",
        legacy=legacy,
        most=MAX_CALLS if several else 1,
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
    if plan.most > 1:  # the bound (MAX_CALLS) is the grammar's: a small model counts badly
        lines.append(
            "If the user asks about several things, make one call for each, one JSON object per "
            "line. Do not repeat a call."
        )
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


def _values(text: str, most: int) -> tuple[list[Any], int]:
    """The JSON values ``text`` starts with, one after another (at most ``most`` + 1), and
    where the first text that is not one of them starts (``len(text)`` when none is left)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    at = len(text) - len(text.lstrip())
    while at < len(text) and len(found) <= most:
        try:
            data, end = decoder.raw_decode(text, at)
        except ValueError:
            return found, at
        found.append(data)
        rest = text[end:]
        at = end + len(rest) - len(rest.lstrip())
    return found, at


def _objects(text: str, most: int) -> tuple[list[Any], bool]:
    """The JSON values ``text`` starts with (at most ``most`` + 1), and whether they are all of
    it (white space aside)."""
    found, at = _values(text, most)
    return found, at >= len(text)


def _key(data: Any) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


def _whole(found: list[Any], plan: CallPlan) -> list[tuple[str, Any]] | None:
    """The (name, arguments) of each of the complete calls ``found``, repeats dropped, or None
    when one of them is not a call to one of the plan's functions."""
    names = {name for name, _ in plan.functions}
    calls: dict[str, tuple[str, Any]] = {}
    for data in found:
        if not (isinstance(data, dict) and data.get("name") in names and "arguments" in data):
            return None
        calls.setdefault(_key(data), (str(data["name"]), data["arguments"]))
    return list(calls.values())


def _calls(text: str, plan: CallPlan) -> list[tuple[str, Any]] | None:
    """The (name, arguments) of each call that ``text`` is made of, repeats dropped, or None
    when it is not wholly a run of at most ``plan.most`` calls to the plan's functions."""
    found, whole = _objects(text, plan.most)
    if not whole or not found or len(found) > plan.most:
        return None
    return _whole(found, plan)


@dataclass(frozen=True)
class _CutArguments:
    """The arguments of a call cut off by ``max_tokens``: the text that came, handed out as is."""

    text: str


_NAME_SO_FAR = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)(")?')
_ARGUMENTS_KEY = re.compile(r'\s*,\s*"arguments"\s*:\s*')


def _cut_call(text: str, plan: CallPlan) -> tuple[str, _CutArguments] | None:
    """(name, arguments as far as they came) of the call that a cut-off ``text`` (one call's
    beginning, as the grammar writes it) starts, or None when its name could be more than one
    of the plan's functions."""
    so_far = _NAME_SO_FAR.match(text)
    if so_far is None:  # cut before the name: '{', '{"na'...
        if not '{"name":"'.startswith(re.sub(r"\s", "", text)):
            return None
        name, closed, rest = "", False, ""
    else:
        name, closed, rest = so_far[1], so_far[2] is not None, text[so_far.end() :]
    names = [n for n, _ in plan.functions if (n == name if closed else n.startswith(name))]
    if len(names) != 1:
        return None
    key = _ARGUMENTS_KEY.match(rest)
    if key is None:  # cut before the arguments (or in their key)
        if not ',"arguments":'.startswith(re.sub(r"\s", "", rest)):
            return None
        return names[0], _CutArguments("")
    arguments = rest[key.end() :]
    try:  # complete arguments (only the call's closing brace was cut) are written as usual
        data, end = json.JSONDecoder().raw_decode(arguments)
    except ValueError:
        return names[0], _CutArguments(arguments)
    if arguments[end:].strip():
        return None
    return names[0], _CutArguments(json.dumps(data, ensure_ascii=False))


def _cut_calls(text: str, plan: CallPlan) -> list[tuple[str, Any]] | None:
    """The calls of an answer cut off by ``max_tokens``: the complete ones, then the cut one
    (its arguments a string, as far as they came) when its function is known; None when
    ``text`` is not the beginning of a run of calls."""
    found, at = _values(text, plan.most)
    whole = _whole(found[: plan.most], plan)
    if whole is None:
        return None
    if len(found) >= plan.most or at >= len(text):
        return whole
    cut = _cut_call(text[at:], plan)
    if cut is None:
        return whole
    return [*whole, cut]


def repeats(text: str) -> bool:
    """Whether the calls ``text`` starts with repeat one another: the answer so far ends with a
    complete call identical to an earlier one (checked by the engine as the answer grows)."""
    if not text.rstrip().endswith("}") or not text.lstrip().startswith("{"):
        return False
    found, _ = _objects(text, MAX_CALLS)
    keys = [_key(data) for data in found]
    return len(keys) > 1 and keys[-1] in keys[:-1]


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, _CutArguments):
        return arguments.text
    return json.dumps(arguments, ensure_ascii=False)


def to_message(
    text: str, plan: CallPlan | None, *, cut: bool = False
) -> tuple[dict[str, Any], bool]:
    """The assistant message for generated ``text``; True when it is a call (or several).

    ``cut``: ``max_tokens`` ended the answer, so a call may be cut off (see the module
    docstring); the last call's arguments are then a string, as far as they came.
    """
    is_calls = plan is not None and text.lstrip().startswith("{")
    calls = _calls(text, plan) if plan is not None and is_calls else None
    if plan is not None and is_calls and calls is None and cut:
        calls = _cut_calls(text.lstrip(), plan)
        if not calls:  # grammar text that names no call is no answer
            return {"role": "assistant", "content": "", "refusal": None}, False
    if plan is None or calls is None:
        return {"role": "assistant", "content": text, "refusal": None}, False
    if plan.legacy:
        name, arguments = calls[0]
        call = {"name": name, "arguments": _arguments_text(arguments)}
        return {"role": "assistant", "content": None, "function_call": call, "refusal": None}, True
    tool_calls = [
        {
            "id": "call_" + uuid.uuid4().hex[:24],
            "type": "function",
            "function": {"name": name, "arguments": _arguments_text(arguments)},
        }
        for name, arguments in calls
    ]
    return {"role": "assistant", "content": None, "tool_calls": tool_calls, "refusal": None}, True


def without_calls(message: dict[str, Any], keys: frozenset[str]) -> dict[str, Any] | None:
    """``message`` (a call, or several) without the calls whose :func:`quality.turns.call_key`
    is in ``keys``; None when no call is left."""
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        key = call_key(str(legacy.get("name") or ""), legacy.get("arguments"))
        return None if key in keys else message
    kept = [
        call
        for call in message.get("tool_calls") or ()
        if call_key(call["function"]["name"], call["function"]["arguments"]) not in keys
    ]
    return {**message, "tool_calls": kept} if kept else None


ANSWER_FROM_RESULTS = "Answer the user's question in plain sentences, using the tool results given."


def text_request(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` asking for text where it allowed calls (``tool_choice: "none"``), for a
    model that made again a call whose result it has. The current turn (since the user's last
    message) is written as the results alone, each naming its call, in one user turn, with an
    instruction to answer from them: written back as JSON, as :func:`prompt_messages` writes
    them, the earlier calls lead a small model to write one more in place of an answer."""
    plan = call_plan(request)
    legacy = plan is not None and plan.legacy
    plain = {**request, ("function_call" if legacy else "tool_choice"): "none"}
    messages = [m for m in request.get("messages") or () if isinstance(m, dict)]
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1) + 1
    out = prompt_messages({**plain, "messages": messages[:start]})
    made: dict[str, str] = {}
    results: list[str] = []
    for message in messages[start:]:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                made[str(call.get("id"))] = _call_text(str(fn.get("name", "")), fn.get("arguments"))
            old = message.get("function_call")
            if isinstance(old, dict):
                made[str(old.get("name"))] = _call_text(
                    str(old.get("name", "")), old.get("arguments")
                )
        elif message.get("role") in ("tool", "function"):
            key = (
                message.get("tool_call_id")
                if message.get("role") == "tool"
                else message.get("name")
            )
            label = made.get(str(key), str(message.get("name") or "a tool"))
            results.append(f"Result of {label}:\n{text_of(message.get('content'))}")
    if results:
        out.append({"role": "user", "content": "\n\n".join(results)})
    if out and out[0]["role"] == "system":
        out[0]["content"] = (out[0]["content"] + "\n\n" + ANSWER_FROM_RESULTS).strip()
    else:
        out.insert(0, {"role": "system", "content": ANSWER_FROM_RESULTS})
    return {**plain, "messages": out}


def finish_reason(plan: CallPlan, request: dict[str, Any]) -> str:
    """OpenAI's finish reason for a call: "stop" when the client named the function."""
    if plan.legacy:
        return "stop" if isinstance(request.get("function_call"), dict) else "function_call"
    return "stop" if isinstance(request.get("tool_choice"), dict) else "tool_calls"
