"""Which requests the local engine can serve at all; the others go to the API as ``unsupported``.

:func:`local_blocker` reads a validated body against :data:`proxy.protocol.params.CHAT_PARAMETERS`
(a parameter marked ``api``, a value the engine lacks: audio, custom tools, ``n`` above
:data:`MAX_LOCAL_N`, token ids of another tokenizer...) and, for a structured answer, asks
:mod:`proxy.engine.grammar` whether its grammar can be built within bounds. It returns the
reason in words, or None when the engine can serve the request. A ``reasoning_effort`` above
``minimal`` is served locally only by a model that thinks (``proxy.engine.reasoning``).
"""

from __future__ import annotations

from typing import Any

from proxy.engine.grammar import grammar_blocker
from proxy.protocol.params import API, CHAT_PARAMETERS

LOCAL_REASONING = frozenset({"none", "minimal"})
LOCAL_PARTS = frozenset({"text", "input_text", "refusal"})
MAX_LOCAL_N = 8


def _set(body: dict[str, Any], name: str) -> bool:
    return body.get(name) is not None


def _own_tokens(body: dict[str, Any]) -> bool:
    """Token ids in the request are the local model's only when the client asked for it."""
    return body.get("model") == "local"


def chat_blocker(body: dict[str, Any], *, thinks: bool = False) -> str | None:
    """Why the local engine cannot serve this chat request, or None when it can. ``thinks``:
    the local model thinks before it answers, so every ``reasoning_effort`` is served."""
    for name, handling in CHAT_PARAMETERS.items():
        if handling == API and _set(body, name):
            return name
    if (body.get("n") or 1) > MAX_LOCAL_N:
        return f"n > {MAX_LOCAL_N}"
    if body.get("logit_bias") and not _own_tokens(body):
        return "logit_bias (token ids of the API model's tokenizer)"
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in LOCAL_REASONING and not thinks:
        return f"reasoning_effort {effort}"
    verbosity = body.get("verbosity")
    if verbosity is not None and verbosity != "medium":
        return f"verbosity {verbosity}"
    modalities = body.get("modalities")
    if modalities is not None and any(m != "text" for m in modalities):
        return "audio output"
    for tool in body.get("tools") or ():
        if tool.get("type", "function") != "function":
            return "custom tools"
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        return f"tool_choice {choice.get('type')}"
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, list) and any(p.get("type") not in LOCAL_PARTS for p in content):
            return "non-text content"
        if message.get("audio") is not None:
            return "audio in the conversation"
        for call in message.get("tool_calls") or ():
            if call.get("type", "function") != "function":
                return "custom tool calls in the conversation"
    fmt = body.get("response_format")
    if uses_tools(body) or (isinstance(fmt, dict) and fmt.get("type") != "text"):
        return grammar_blocker(body)
    return None


def completions_blocker(body: dict[str, Any]) -> str | None:
    """Why the local engine cannot serve this legacy completions request, or None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and not all(isinstance(p, str) for p in prompt):
        if not _own_tokens(body):
            return "token-id prompt (ids of the API model's tokenizer)"
    if isinstance(prompt, list) and len(prompt) * (body.get("n") or 1) > MAX_LOCAL_N:
        return f"more than {MAX_LOCAL_N} choices"
    if (body.get("n") or 1) > MAX_LOCAL_N:
        return f"n > {MAX_LOCAL_N}"
    if body.get("suffix"):
        return "suffix"
    if (body.get("best_of") or 1) > 1:
        return "best_of > 1"
    if body.get("echo") and body.get("logprobs") is not None:
        return "logprobs of an echoed prompt"
    if body.get("logit_bias") and not _own_tokens(body):
        return "logit_bias (token ids of the API model's tokenizer)"
    return None


def local_blocker(body: dict[str, Any], *, thinks: bool = False) -> str | None:
    """Why the local engine cannot serve this request (chat, or legacy with a ``prompt``);
    ``thinks`` as in :func:`chat_blocker`."""
    if "messages" not in body and "prompt" in body:
        return completions_blocker(body)
    return chat_blocker(body, thinks=thinks)


def uses_tools(body: dict[str, Any]) -> bool:
    """Whether the answer may be a tool (or function) call rather than text."""
    if body.get("tools"):
        return body.get("tool_choice") != "none"
    if body.get("functions"):
        return body.get("function_call") != "none"
    return False


def live_streamable(body: dict[str, Any]) -> bool:
    """Whether local tokens can be streamed as they come: one text answer, no tool call."""
    return (body.get("n") or 1) == 1 and not uses_tools(body)
