"""Which request parameters the local engine honours, and which send a request to the API.

Every parameter of OpenAI's chat-completions request is in :data:`CHAT_PARAMETERS`, with what
the local route does with it (the API route always forwards the body unchanged):

- ``honoured``: the local engine does what the parameter asks.
- ``ignored``: accepted and ignored on the local route, because it cannot change the answer
  (billing, caching, storage and abuse-tracking hints meant for the provider).
- ``depends``: honoured for some values; the others send the request to the API.
- ``api``: a request that sets it goes to the API (pre-route reason ``unsupported``).

A parameter the table does not know (a new SDK field, a vendor extension) sends the request to
the API too: nothing is silently dropped. ``docs/openai-compatibility.md`` is the same table for
users, and a test keeps the three (the SDK, this table, the document) in step.
"""

from __future__ import annotations

from typing import Any

HONOURED, IGNORED, DEPENDS, API = "honoured", "ignored", "depends", "api"

CHAT_PARAMETERS: dict[str, str] = {
    "model": HONOURED,
    "messages": DEPENDS,  # text parts locally; image, audio and file parts go to the API
    "stream": HONOURED,
    "stream_options": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "max_tokens": HONOURED,
    "max_completion_tokens": HONOURED,
    "stop": HONOURED,
    "seed": HONOURED,
    "n": HONOURED,
    "presence_penalty": HONOURED,
    "frequency_penalty": HONOURED,
    "logit_bias": DEPENDS,  # token ids are the local model's only with model "local"
    "logprobs": HONOURED,
    "top_logprobs": HONOURED,
    "response_format": HONOURED,
    "tools": DEPENDS,  # function tools locally; custom tools go to the API
    "tool_choice": DEPENDS,  # allowed_tools and custom choices go to the API
    "parallel_tool_calls": HONOURED,
    "functions": HONOURED,
    "function_call": HONOURED,
    "reasoning_effort": DEPENDS,  # none / minimal locally: the local model does not reason
    "verbosity": DEPENDS,  # medium (the default) locally
    "modalities": DEPENDS,  # ["text"] locally
    "audio": API,
    "web_search_options": API,
    "moderation": API,
    "prediction": IGNORED,
    "user": IGNORED,
    "safety_identifier": IGNORED,
    "store": IGNORED,
    "metadata": IGNORED,
    "service_tier": IGNORED,
    "prompt_cache_key": IGNORED,
    "prompt_cache_retention": IGNORED,
    "prompt_cache_options": IGNORED,
}

COMPLETIONS_PARAMETERS: dict[str, str] = {
    "model": HONOURED,
    "prompt": DEPENDS,  # text locally; token-id prompts go to the API (they are its tokens)
    "stream": HONOURED,
    "stream_options": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "max_tokens": HONOURED,
    "stop": HONOURED,
    "seed": HONOURED,
    "n": HONOURED,
    "presence_penalty": HONOURED,
    "frequency_penalty": HONOURED,
    "logit_bias": DEPENDS,
    "logprobs": DEPENDS,  # with echo, prompt logprobs need the API
    "echo": HONOURED,
    "best_of": DEPENDS,  # 1 locally
    "suffix": API,
    "user": IGNORED,
}

LOCAL_REASONING = frozenset({"none", "minimal"})
LOCAL_PARTS = frozenset({"text", "input_text", "refusal"})
MAX_LOCAL_N = 8


def unknown_parameters(body: dict[str, Any], table: dict[str, str]) -> list[str]:
    return sorted(k for k in body if k not in table)


def _set(body: dict[str, Any], name: str) -> bool:
    return body.get(name) is not None


def _own_tokens(body: dict[str, Any]) -> bool:
    """Token ids in the request are the local model's only when the client asked for it."""
    return body.get("model") == "local"


def chat_blocker(body: dict[str, Any]) -> str | None:
    """Why the local engine cannot serve this chat request, or None when it can."""
    unknown = unknown_parameters(body, CHAT_PARAMETERS)
    if unknown:
        return f"unknown parameter '{unknown[0]}'"
    for name, handling in CHAT_PARAMETERS.items():
        if handling == API and _set(body, name):
            return name
    if (body.get("n") or 1) > MAX_LOCAL_N:
        return f"n > {MAX_LOCAL_N}"
    if body.get("logit_bias") and not _own_tokens(body):
        return "logit_bias (token ids of the API model's tokenizer)"
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in LOCAL_REASONING:
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
        from proxy.engine.grammar import grammar_blocker

        return grammar_blocker(body)
    return None


def completions_blocker(body: dict[str, Any]) -> str | None:
    """Why the local engine cannot serve this legacy completions request, or None."""
    unknown = unknown_parameters(body, COMPLETIONS_PARAMETERS)
    if unknown:
        return f"unknown parameter '{unknown[0]}'"
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


def local_blocker(body: dict[str, Any]) -> str | None:
    """Why the local engine cannot serve this request (chat, or legacy with a ``prompt``)."""
    if "messages" not in body and "prompt" in body:
        return completions_blocker(body)
    return chat_blocker(body)


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
